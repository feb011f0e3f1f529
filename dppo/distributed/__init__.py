"""Every Ray call: the actors that sample, the weight broadcast, the learner group, joining a cluster."""

"""The same-node transport between a sampling actor and the inference service: shared-memory segments and small
messages on a Unix socket, so a step's request costs no Ray call. Plain Python, no Ray: ``protocol`` (messages,
layout, segments), ``client`` (the actor's side) and ``server`` (the service's side)."""

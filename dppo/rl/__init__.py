"""The PPO algorithm without Ray: spaces, model, agent, sampler, advantages, trainer, normalizer, segment."""

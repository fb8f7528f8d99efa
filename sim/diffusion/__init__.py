"""Diffusion serving: pipelines (text encoders, DiT, VAE) costed on the roofline, parallel plans
over a node's GPUs, and the node pool that queues and gang-schedules jobs."""

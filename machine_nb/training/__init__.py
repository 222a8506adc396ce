"""Training: SFT and DPO through tinker-cookbook's own loops, the child process that runs them, their
log dirs, preference pairs and sweeps.
"""

"""Multi-process roles: Ray actors for the asynchronous loop and torch.distributed data parallelism.

Importing this package does not import Ray; each module imports it when it needs it.
"""

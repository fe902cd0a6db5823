"""Helpers for training frameworks that rebuild data loaders.

Lightning rebuilds a loader with ``type(loader)(**its arguments)``, which keeps
a ThreadDataLoader as it is: nothing to do. Accelerate rebuilds every loader as
a plain ``torch.utils.data.DataLoader``; :mod:`threadloader.integrations.accelerate`
keeps the threads.
"""

"""The public path of `on_child_start` (DESIGN.md): a child process's side of the process
pool is obsq/engine/pools/child.py."""

from obsq.engine.pools.child import on_child_start

__all__ = ["on_child_start"]

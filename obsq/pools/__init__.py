"""The public path of `on_child_start` (obsq.pools.child, DESIGN.md): the pools where plain
handlers run are in obsq/engine/pools/."""

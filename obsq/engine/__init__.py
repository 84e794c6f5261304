"""Running tasks: the worker (fetch, execute, settle, its loops, pools/ where plain handlers
run, the maintenance sweeps) and the scheduler. It enqueues through producer/ and knows nothing
of observability/, which plugs in through the App's hooks."""

"""Reading a namespace as an operator sees it: the Inspector (bounded reads and repairs),
the records it returns, task groups and partitioned queues gathered under their names. Both
the operator's tools (ops/) and the queue gauges (observability/) read through it."""

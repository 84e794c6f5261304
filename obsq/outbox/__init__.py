"""A transactional outbox on SQLAlchemy 2 (`pip install obsq[outbox]`): tasks written as
rows in the application's own database transaction (`Outbox.enqueue`), and moved to Redis
once committed by a relay (`obsq outbox --database-url URL`, or `obsq worker ...
--outbox-database-url URL`). A rolled-back transaction leaves no task; a producer that
dies right after its commit, or a relay killed mid-batch, loses none and doubles none.

Modules, in the order of the data flow: table (the rows), enqueue (Outbox, the producer's
side), relay and wakeup (the relay's loop, what wakes it and which relay leads), metrics,
process (the relay as a process, or beside a worker). Not imported by `import obsq`."""

from obsq.outbox.enqueue import Outbox
from obsq.outbox.relay import Relay
from obsq.outbox.table import DEFAULT_TABLE, outbox_table

__all__ = ["DEFAULT_TABLE", "Outbox", "Relay", "outbox_table"]

"""A FastAPI app whose orders and their confirmation tasks commit together, through the
transactional outbox: an order rolled back sends no email, and an order committed gets its
email even if the process dies right after the commit.

    pip install 'obsq[outbox]' fastapi uvicorn
    uvicorn examples.fastapi_outbox:api --port 8000      # creates shop.db (SQLite)
    obsq outbox --database-url sqlite:///shop.db --namespace shop
    curl -X POST 'localhost:8000/orders?email=a@b.c'
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException
from sqlalchemy import String, create_engine, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import obsq
from obsq.outbox import Outbox, outbox_table

DATABASE_URL = os.environ.get("DATABASE_URL", "sqlite:///shop.db")
REDIS_URL = os.environ.get("OBSQ_REDIS_URL", "redis://localhost:6379/0")


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200))


# The outbox's table in the application's metadata: Alembic's autogenerate writes its
# migration beside the orders' (here create_all makes both).
outbox_table(Base.metadata)
engine = create_engine(DATABASE_URL)
outbox = Outbox(engine, metadata=Base.metadata)


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    Base.metadata.create_all(engine)
    # one Client for the process, for what is read from Redis (a task's state)
    api.state.obsq = obsq.Client(REDIS_URL, namespace="shop")
    yield
    await api.state.obsq.close()
    engine.dispose()


api = FastAPI(title="shop", lifespan=lifespan)


def database() -> Iterator[Session]:
    with Session(engine) as session:
        yield session


@api.post("/orders")
def place_order(email: str, db: Annotated[Session, Depends(database)]) -> dict[str, object]:
    """The order and its task in one transaction: both or neither."""
    with db.begin():
        order = Order(email=email)
        db.add(order)
        db.flush()  # the order's id, for the task
        task_id = outbox.enqueue(db, "email:confirm", {"order": order.id, "to": email},
                                 queue="emails", max_retry=10)
        if "@" not in email:  # refused after the enqueue: the rollback takes the task too
            raise HTTPException(422, "not an email address")
    return {"order": order.id, "task": task_id}


@api.get("/tasks/{task_id}")
async def task_state(task_id: str) -> dict[str, str]:
    """A task's state; one whose row the relay has not moved yet is `committed`."""
    try:
        info = await api.state.obsq.info(task_id)
    except obsq.TaskNotFound:
        with Session(engine) as db:
            waiting = db.scalar(select(func.count()).select_from(outbox.table)
                                .where(outbox.table.c.task_id == task_id))
        if not waiting:
            raise HTTPException(404, "no such task") from None
        return {"task": task_id, "state": "committed"}
    return {"task": task_id, "state": info.state}

"""An order row and its event committed together: the outbox without a relay.

    FLUXPG_DSN=postgresql://postgres@127.0.0.1:5432/postgres python examples/outbox_orders.py

`place_order` writes the order with SQLAlchemy and publishes `$queue/orders/created` with
`fluxpg.publish` in the same transaction. Any MQTT or AMQP consumer of queue `orders` (a running
`fluxpg serve` on the same database) gets the event if and only if the order commits; a rollback
leaves neither. The broker's queue `orders` must exist (configured, or auto-created when a
consumer subscribes) before the first publish.
"""
from __future__ import annotations

import asyncio
import json
import os

from sqlalchemy import Integer, String
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import fluxpg


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "shop_orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))
    total_cents: Mapped[int] = mapped_column(Integer)


async def place_order(session: AsyncSession, order_id: int, customer: str, total_cents: int) -> None:
    async with session.begin():
        session.add(Order(id=order_id, customer=customer, total_cents=total_cents))
        event = {"order": order_id, "customer": customer, "total_cents": total_cents}
        await fluxpg.publish(session, "$queue/orders/created", json.dumps(event).encode(),
                             {"content-type": "application/json", "source": "shop"})


async def main() -> None:
    dsn = os.environ.get("FLUXPG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
    engine = create_async_engine(dsn.replace("postgresql://", "postgresql+asyncpg://", 1))
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    sessions = async_sessionmaker(engine)
    async with sessions() as session:
        await place_order(session, 1, "ada", 4200)
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())

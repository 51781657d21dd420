"""AMQP 0-9-1 front-end (RabbitMQ clients: aio-pika, pika, …) on fluxpg queues and streams.

Modules: framing.py (sans-I/O frame splitting/encoding over pamqp), properties.py (basic
properties ↔ stored headers), exchanges.py (per-connection exchanges and bindings),
channel.py (channel state machine), connection.py (handshake, heartbeats, `handle`).

Semantics (FluxMQ's documented behaviour, DESIGN §4), and the choices made where it is silent:

* Queue names: `orders`, `orders/eu/#` and `$queue/orders/#` name the same queue (plus an optional
  consumer filter). Consuming a bare name that does not exist is 404 NOT_FOUND (RabbitMQ); the
  explicit `$queue/<name>` form creates it as `queue_manager.auto_create` says (FluxMQ).
* queue.declare of a new `durable` queue creates a durable fluxpg queue (as auto_create says:
  durable by default; off: 404) from `x-queue-type`, `x-max-age`, `x-max-length`, `x-overflow`,
  `x-max-length-bytes`, `x-message-ttl`, `x-dead-letter-exchange`, `x-dead-letter-routing-key`.
  `exclusive`, `auto_delete`, non-durable and server-named (`amq.gen-…`) queues are transient
  queues (fluxpg/queues/transient.py): the same SQL semantics, messages in the unlogged
  fluxpg.log_transient; an exclusive queue is refused to other connections (405) and deleted with
  its connection, an auto-delete queue with its last consumer, any of them with their node. An
  existing queue keeps its settings (so a client's declare never resets a configured retry
  policy); an explicit `x-queue-type` that differs from the existing kind is 406. Passive
  declare: 404 when missing. message-count (declare-ok, get-ok) = messages the queue's default
  group can still get (undelivered plus requeued); consumer-count = consumers on this node.
* x-dead-letter-exchange is resolved to a queue when the queue is declared (exchanges are
  per-connection): the default exchange with x-dead-letter-routing-key names the queue, another
  exchange routes that key (or the queue's name); rejected, over-retried and expired messages go
  there (no route: fluxpg's `$dlq/<queue>`). x-overflow drop-head drops the oldest undelivered
  messages (not dead-lettered); reject-publish (the default) nacks the publish.
* queue.purge (classic): every undelivered message is skipped (fluxpg.purge_queue: group cursors
  to the head; the log is left to retention), delivered-unacknowledged ones stay pending;
  purge-ok counts the skipped ones. A stream is refused (406). queue.delete drops the queue with
  its segments (fluxpg.delete_queue; if-unused / if-empty), its consumers get basic.cancel; a
  queue of the config file is refused (406); deleting an unknown queue succeeds (RabbitMQ).
  Non-passive declares of `amq.*` names are 403 (reserved for server-named queues).
* Exchanges and bindings are per connection and never persisted (FluxMQ). Publishing through an
  exchange appends to `$queue/<queue>/<routing-key>` for every bound queue; direct, fanout,
  topic (AMQP `*`/`#` words) and headers exchanges, exchange-to-exchange bindings.
* Default exchange: routing key `$queue/<q>/…` or a bare queue name. `mandatory` + no queue →
  basic.return 312 NO_ROUTE (a reserved catch-all queue does not count as a route); without
  `mandatory` the queue is created as queue_manager.auto_create says (off: 404 closes the channel).
* Publisher confirms: basic.ack only after the append committed; a failed append is basic.nack.
  A message too large for its queue or an invalid topic closes the channel with 406; a body
  larger than any queue accepts is 311 CONTENT_TOO_LARGE at its content header.
* `$queue/<q>/$commit` with headers `x-group-id`, `x-offset` (the last processed offset) commits a
  stream group at x-offset + 1; `$queue/<q>/$ack|$nack|$reject` with `message-id`, `group-id`
  settle a delivery like the MQTT front-end does.
* basic.consume arguments: `x-consumer-group` (default: the queue name, so a queue's consumers
  share its messages as in RabbitMQ and a stream reader resumes from the same checkpoint — give
  stream readers distinct groups to read independently), `x-stream-offset` (first, last, next,
  an integer, offset=N, timestamp=N, an AMQP timestamp), `x-auto-commit` (bool or "true").
  `exclusive`: the queue's only consumer on this node (403 ACCESS_REFUSED for another consumer,
  or for an exclusive one while others exist); consumers on other nodes are not seen.
* basic.qos: prefetch per consumer (global=false, for consumers created afterwards) or per channel
  (global=true); prefetch_size is ignored.
* basic.ack → ack (stream: checkpoint); nack/reject with requeue → nack (classic: redelivered at
  once, or after the retry backoff when the queue sets retry.nack_backoff; stream: no-op); without
  requeue → reject (classic: dead-letter; stream: skip). Unacknowledged deliveries are requeued
  at once (fluxpg.release: no backoff, original order, redelivered flag) when their channel
  closes, the connection is lost or on basic.recover. basic.cancel gives back what the channel's
  prefetch held back; delivered, unacknowledged messages stay the client's to ack (as in
  RabbitMQ) until recover, nack, or the channel closing.
* basic.get claims one message for the queue's default group.
* Per-message `expiration` (milliseconds) is enforced, like `x-message-ttl` /
  `limits.message_ttl`; expired messages are dead-lettered when the queue has a dead-letter
  exchange, skipped otherwise. `connection.blocked` is advertised (clients may
  receive it) but never sent: a full queue nacks its publishes instead (`max_depth`).
* tx.select/commit/rollback: the channel's publishes and acks/nacks/rejects are collected in a
  queues Transaction and applied in one PostgreSQL transaction at commit (nothing at rollback or
  channel close); tx and confirm mode exclude each other (406).
* Virtual hosts: "/" and `amqp091.virtual_hosts` of the config are accepted and reach the same
  queues; others are connection.close 530. connection.update-secret re-authenticates the user
  (403 when refused).
* Not supported: channel.flow(active=false) (540 NOT_IMPLEMENTED), auth mechanisms other than
  PLAIN.
"""

"""Where the writer runs under ``tf.distribute``: which replica records, and state outside the strategy.

Under ``tf.distribute`` one event is written per step, by one replica:
replica 0 of the chief (``strategy.extended.should_save_summary``). Every
other worker keeps its event file closed (none is created) and writes
nothing. The writer's state (window accumulators, fresh flags, the write
counter) lives in plain variables of the process that writes, updated by that
replica only (``host_variable``).

Used by ``tb_gradcheck.tensorflow.writer`` and ``tb_gradcheck.keras``.
"""

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops


def host_variable(initial_value, dtype, name):
    """A plain variable of this process, whatever distribution strategy is in scope.

    Variables made under a strategy (also in ``tf.init_scope()`` inside
    ``strategy.run``, which is where the writer first runs) become the
    strategy's distributed variables, and neither kind fits this state:

    - ``MirroredVariable`` (the default, aggregation NONE): in replica context
      each replica updates its own copy, so the copies drift apart, since
      only replica 0 records summaries;
    - ``MultiWorkerMirroredStrategy`` broadcasts every new variable's initial
      value from the chief, a collective that each worker must join in the
      same order. State created only where the writer writes would hang the
      other workers.

    The writer's state is used by one replica of one process and needs
    neither copies nor collectives, so it is made directly as a
    ResourceVariable, which does not go through the strategy's variable
    creator. It is not tracked by any model or checkpoint.
    """
    with tf.init_scope():
        return resource_variable_ops.ResourceVariable(tf.constant(initial_value, dtype), trainable=False, name=name)


def writing_replica():
    """Whether this replica records: True, False, or a bool tensor when only known at run time.

    One replica per step records: replica 0 of the worker that saves
    summaries (the chief; every worker of a single-worker strategy). In
    cross-replica context the code runs once per worker, so the worker decides.
    tf.summary makes the same choice for summaries (it records in replica
    context only where ``replica_id_in_sync_group == 0``); the writer makes it
    for its state updates too, which would otherwise run on every replica.
    """
    strategy = tf.distribute.get_strategy()
    if not strategy.extended.should_save_summary:
        return False
    context = tf.distribute.get_replica_context()
    if context is None:
        return True
    replica = context.replica_id_in_sync_group
    static = tf.get_static_value(replica)
    if static is not None:
        return int(static) == 0
    return tf.equal(replica, 0)


def sum_over_replicas(gradients):
    """Sums per-replica gradients over the replicas in sync, as Keras optimizers do before applying them."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return gradients
    present = [g for g in gradients if g is not None]
    if not present:
        return gradients
    summed = iter(context.all_reduce(tf.distribute.ReduceOp.SUM, present))
    return [None if g is None else next(summed) for g in gradients]

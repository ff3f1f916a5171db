"""Units without gradient: idle from the start (healthy), a dead phase that recovers (healthy), dying after a learning-rate jump.

Each premise is measured with a forward pass over held-out examples
(``silent_units``): which units are zero on every one of them, before and
after, not what the writer saw.
"""

import numpy as np

from corpus.healthy import _batches
from corpus.healthy import _mlp
from corpus.healthy import _regression
from corpus.healthy import _tf
from corpus.registry import Expect
from corpus.registry import custom_loop
from corpus.registry import head_tail
from corpus.registry import scenario
from corpus.registry import silent_units

JUMP_STEP = 150
PHASE = (60, 100)  # steps served from one class only


@scenario(Expect("dead", ("mlp/hidden",), severity="info"))
def idle_units_stable(run_dir):
    """A ReLU layer on raw, non-centred features (intensities in [0.7, 1], fed without standardisation, as is common): each unit's response to the features' shared positive part has a sign set at initialisation, so a large share of units is silent on every input from step 0 and stays so while the loss falls. A property of a healthy network: information, not a warning."""
    tf = _tf()
    tf.keras.utils.set_random_seed(41)
    rng = np.random.default_rng(41)
    x = rng.uniform(0.7, 1.0, (4096, 32)).astype(np.float32)
    y = ((x - 0.85) @ rng.normal(size=(32, 1)) * 4).astype(np.float32)
    held = x[-512:]  # never trained on
    model = tf.keras.Sequential(
        [
            tf.keras.Input((32,)),
            tf.keras.layers.Dense(64, activation="relu", kernel_initializer="he_normal", name="hidden"),
            tf.keras.layers.Dense(1, name="out"),
        ],
        name="mlp",
    )
    before = silent_units(model, "hidden", held)
    losses, _, _ = custom_loop(
        run_dir,
        model,
        tf.keras.losses.MeanSquaredError(),
        _batches(x[:-512], y[:-512], 64, 300, 41),
        tf.keras.optimizers.Adam(3e-3),
    )
    after = silent_units(model, "hidden", held)
    first, last = head_tail(losses)
    kept = float(after[before].mean()) if before.any() else 0.0
    numbers = {
        "idle_share_start": float(before.mean()),
        "idle_share_end": float(after.mean()),
        "idle_at_start_still_idle": kept,
        "loss_first": first,
        "loss_last": last,
    }
    return numbers, [
        ("a third or more of the units silent on every held-out example at the start", before.mean() >= 1 / 3),
        ("the share is stable: within 0.1 at the end", abs(after.mean() - before.mean()) <= 0.1),
        ("the same units: 90% of those idle at the start still are", kept >= 0.9),
        ("loss fell by a third", last <= 2 / 3 * first),
    ]


@scenario()
def idle_units_drift(run_dir):
    """The same raw features in [0.5, 1] at a higher rate: units near their threshold drift into silence as the layer trains, and the idle share creeps up by a fifth of the layer while the loss falls tenfold. Drift of a healthy layer, not units dying: the warning must wait for a large part of the live units to stop."""
    tf = _tf()
    tf.keras.utils.set_random_seed(40)
    rng = np.random.default_rng(40)
    x = rng.uniform(0.5, 1.0, (4096, 32)).astype(np.float32)
    y = ((x - 0.75) @ rng.normal(size=(32, 1)) * 4).astype(np.float32)
    held = x[-512:]
    model = tf.keras.Sequential(
        [
            tf.keras.Input((32,)),
            tf.keras.layers.Dense(64, activation="relu", kernel_initializer="he_normal", name="hidden"),
            tf.keras.layers.Dense(1, name="out"),
        ],
        name="mlp",
    )
    before = silent_units(model, "hidden", held)
    losses, _, _ = custom_loop(
        run_dir,
        model,
        tf.keras.losses.MeanSquaredError(),
        _batches(x[:-512], y[:-512], 64, 300, 40),
        tf.keras.optimizers.Adam(3e-3),
    )
    after = silent_units(model, "hidden", held)
    first, last = head_tail(losses)
    live_lost = float((after.mean() - before.mean()) / (1 - before.mean()))
    numbers = {
        "idle_share_start": float(before.mean()),
        "idle_share_end": float(after.mean()),
        "live_units_lost": live_lost,
        "loss_first": first,
        "loss_last": last,
    }
    return numbers, [
        ("the idle share crept up by a tenth of the layer or more", after.mean() - before.mean() >= 0.1),
        ("a third of the live units or fewer went idle: drift, not dying", live_lost <= 1 / 3),
        ("loss fell fivefold", last <= first / 5),
    ]


@scenario(Expect("dead", ("mlp/hidden",), severity="info"))
def dead_phase_recovers(run_dir):
    """A stretch of unshuffled data: for 40 steps the loader serves one class only (a shard sorted by label, a curriculum stage). Hidden units that respond only to the other classes are silent on every example of those batches, as dead ones are, and fire again once mixed batches return. A dead phase that recovered: information, not a warning."""
    tf = _tf()
    tf.keras.utils.set_random_seed(42)
    rng = np.random.default_rng(42)
    classes, features = 8, 32
    patterns = rng.normal(size=(classes, features)).astype(np.float32)

    def draw(n, only=None):
        y = np.full(n, only) if only is not None else rng.integers(0, classes, n)
        return (patterns[y] + 0.02 * rng.normal(size=(n, features))).astype(np.float32), y

    model = tf.keras.Sequential(
        [
            tf.keras.Input((features,)),
            tf.keras.layers.Dense(256, activation="relu", kernel_initializer="he_normal", name="hidden"),
            tf.keras.layers.Dense(classes, name="out"),
        ],
        name="mlp",
    )
    mixed, _ = draw(512)
    one_class, _ = draw(512, only=0)
    batches = [draw(64, only=0 if PHASE[0] <= step < PHASE[1] else None) for step in range(200)]
    before = silent_units(model, "hidden", mixed)
    seen = {}

    def measure(step):
        if step == PHASE[1] - 1:  # the phase's last step
            seen["in_phase"] = silent_units(model, "hidden", one_class)

    loss, _, _ = custom_loop(
        run_dir,
        model,
        tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        batches,
        tf.keras.optimizers.Adam(1e-3),
        after_step=measure,
    )
    in_phase = seen["in_phase"]
    after = silent_units(model, "hidden", mixed)
    first, last = head_tail(loss)
    numbers = {
        "silent_on_mixed_start": float(before.mean()),
        "silent_on_the_phase_class_in_phase": float(in_phase.mean()),
        "silent_on_mixed_end": float(after.mean()),
        "loss_first": first,
        "loss_last": last,
    }
    # Each unit's response to one class has a sign set by its weights, a
    # coin flip: about half are silent on all of the phase's batches. 42%
    # or more of the layer silent from a live start is what dying means
    # (dying_share 0.4), for as long as the phase lasts.
    return numbers, [
        ("under 10% of the units silent on mixed data at the start", before.mean() < 0.1),
        ("42% or more silent on every example of the phase's class, at its end", in_phase.mean() >= 0.42),
        ("under 10% silent on mixed data at the end: they recovered", after.mean() < 0.1),
        ("loss fell by half", last <= 0.5 * first),
    ]


@scenario(Expect("dead", ("mlp/dense_1", "mlp/dense_2"), steps=(JUMP_STEP, JUMP_STEP + 60), severity="warning"))
def dying_after_lr_jump(run_dir):
    """A ReLU MLP trains at Adam 1e-3, then its learning rate jumps fifty-fold at step 150 (a schedule restarting at the wrong base rate): units alive before the jump stop firing after it and never recover, the classic dying ReLU (Lu et al. 2019)."""
    tf = _tf()
    tf.keras.utils.set_random_seed(50)
    x, y = _regression(50)
    model = _mlp("mlp", [64, 64, 64], "relu", "he_normal", 16)
    shares = {}

    class Jump(tf.keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            return tf.where(step < JUMP_STEP, 1e-3, 5e-2)

    def measure(step):
        if step == JUMP_STEP - 1:  # the last step before the jump
            for i in range(3):
                shares[f"silent_dense_{i}_at_jump"] = float(silent_units(model, f"dense_{i}", x).mean())

    _, norms, _ = custom_loop(
        run_dir,
        model,
        tf.keras.losses.MeanSquaredError(),
        _batches(x, y, 64, 300, 50),
        tf.keras.optimizers.Adam(Jump()),
        after_step=measure,
    )
    for i in range(3):
        shares[f"silent_dense_{i}_end"] = float(silent_units(model, f"dense_{i}", x).mean())
    total = np.sqrt((norms**2).sum(axis=1))
    total_before, total_after = total[:JUMP_STEP], total[JUMP_STEP:]
    shares["largest_norm_after_over_median_before"] = float(total_after.max() / np.median(total_before[-50:]))
    return shares, [
        (
            "dense_1 and dense_2 alive at the jump (under 5% silent)",
            max(shares["silent_dense_1_at_jump"], shares["silent_dense_2_at_jump"]) < 0.05,
        ),
        (
            "60% or more of each silent at the end",
            min(shares["silent_dense_1_end"], shares["silent_dense_2_end"]) >= 0.6,
        ),
        ("dense_0 alive at the end", shares["silent_dense_0_end"] < 0.1),
        # Units die, the gradient does not explode: no step's norm is near
        # a hundred times (rise_orders) the norm before the jump.
        (
            "no gradient explosion: the largest norm after the jump under 50x the one before",
            shares["largest_norm_after_over_median_before"] < 50,
        ),
    ]

"""Dead units by state: mostly dead from initialisation, recovered only when alive again, cut off behind a silent layer.

Written by the real TensorFlow writer from gradients whose zero columns are
set by hand (a unit whose every gradient element is 0 got no gradient on
the batch), and read back as the tab reads them.
"""

import numpy as np
import tensorflow as tf

from tb_gradcheck import GradientWriter
from tb_gradcheck.findings import diagnose


def _dead_of(run_dir, silent, steps=80, units=16):
    """Layers ``first`` then ``last``, each a kernel ``[4, units]``; ``silent(step)`` -> (units of first, units of last) without gradient.

    Returns the ``dead`` finding's evidence by layer (of every dead finding and consequence) and the findings.
    """
    from tb_gradcheck.reader import queries
    from tb_gradcheck.reader import store

    kernels = [tf.Variable(np.ones((4, units), np.float32), name=name) for name in ("first", "last")]
    with GradientWriter(run_dir) as writer:
        for step in range(steps):
            grads = []
            for quiet in silent(step):
                g = np.ones((4, units), np.float32)
                g[:, list(quiet)] = 0.0
                grads.append(tf.constant(g))
            writer.write(grads, kernels, step)
    s, ctx, eid = store.local_store(run_dir.parent)
    matrix = queries.matrix(s, ctx, eid, s.run(ctx, eid, run_dir.name), "stats", "layer")
    found = diagnose.find("r", matrix)
    dead = [c for f in found for c in [f, *f.consequences] if c.kind == "dead"]
    return {n: (f, e) for f in dead for n, e in f.evidence.items()}, found


def test_most_of_a_layer_dead_from_initialisation_is_a_warning_under_the_silent_bar(tmp_path):
    """13 of 16 units (81%) never fire: no rise to be dying, under 90% to be silent, far above a coin flip's half."""
    dead, _ = _dead_of(tmp_path / "r", lambda step: (range(13), ()))
    f, e = dead["first"]
    assert f.severity == "warning" and e["state"] == "mostly_dead" and e["since"] == "initialisation"
    assert "dead from initialisation" in f.message and "last" not in dead


def test_half_a_layer_idle_from_the_start_stays_information(tmp_path):
    """A coin flip per unit idles about half of a layer in a healthy network: 9 of 16 is no pathology."""
    dead, _ = _dead_of(tmp_path / "r", lambda step: (range(9), ()))
    f, e = dead["first"]
    assert f.severity == "info" and e["state"] == "idle"


def test_a_silent_layer_that_falls_under_the_silent_bar_has_not_recovered(tmp_path):
    """15 of 16 dead for 30 steps, then 13: most of the layer is still dead at the latest writes."""
    dead, _ = _dead_of(tmp_path / "r", lambda step: (range(15) if step < 30 else range(13), ()))
    f, e = dead["first"]
    assert f.severity == "warning" and e["state"] == "mostly_dead" and "recovered" not in f.message


def test_recovered_means_alive_again_and_partly_where_an_idle_sized_share_is_left(tmp_path):
    dead, _ = _dead_of(tmp_path / "r", lambda step: (range(15) if step < 30 else (), ()))
    f, e = dead["first"]
    assert f.severity == "info" and e["state"] == "recovered" and e["latest_dead_unit_fraction"] == 0
    dead, _ = _dead_of(tmp_path / "r2", lambda step: (range(15) if step < 30 else range(8), ()))
    f, e = dead["first"]
    assert f.severity == "info" and e["state"] == "partly_recovered" and e["latest_dead_unit_fraction"] == 0.5
    assert "partly recovered" in f.message


def test_a_dying_layer_then_cut_off_is_named_dying_and_counted_by_the_silent_layer(tmp_path):
    """``first`` loses 12 of 16 live units at step 10; from step 50 every unit of ``last`` is silent, and no gradient reaches ``first``."""

    def silent(step):
        if step >= 50:
            return range(16), range(16)
        return (range(12) if step >= 10 else ()), ()

    dead, _ = _dead_of(tmp_path / "r", silent)
    f, e = dead["first"]
    assert f.severity == "warning" and e["state"] == "dying"
    assert e["first_step"] == 10 and e["cut_off_from_step"] == 50 and e["cut_off_behind"] == "last"
    assert e["last_step"] == 79 and "then cut off from step 50 behind last" in diagnose.describe(f, str)
    f, e = dead["last"]
    assert e["state"] == "silent" and e["layers_cut_off_behind"] == 1


def test_a_whole_network_without_gradient_on_some_batches_is_the_loss_not_dead_units(tmp_path):
    """Every layer wholly silent at once on the last 6 batches of each 20-step epoch (sample weights 0 on padding),
    the gradient back at each epoch's start: no gradient step moved a weight, so no unit came back to life; the
    batches had no loss gradient. No dead finding. The same silence kept to the last write is still the last
    layer's dead units, the layers behind it cut off."""
    dead, _ = _dead_of(tmp_path / "r", lambda step: (range(16), range(16)) if step % 20 >= 14 else ((), ()))
    assert dead == {}
    dead, _ = _dead_of(tmp_path / "r2", lambda step: (range(16), range(16)) if step >= 54 else ((), ()))
    f, e = dead["last"]
    assert f.severity == "warning" and e["state"] == "silent" and e["layers_cut_off_behind"] == 1

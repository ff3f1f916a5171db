"""A training process that checkpoints and is killed, or resumes from the checkpoint, into one run (test_resume.py).

    python tests/resume_job.py torch LOGDIR CKPT START STOP [KILL_AFTER]
    python tests/resume_job.py keras ROOT KILL_AT_ITERATION|-1

torch: a plain loop from step START (0: fresh weights, else the checkpoint
CKPT holds model, optimizer and the step), checkpointing every 5 steps;
after step KILL_AFTER it SIGKILLs itself (the writer gets no close). Its
data depend on START, so a resumed process's gradients differ from the dead
one's at the steps both wrote. Prints each written step's first layer's
gradient norm as ``norm STEP VALUE``.

keras: ``model.fit`` with ``BackupAndRestore`` (listed after the
GradientCallback, so it restores the iterations after the callback's
on_train_begin) killed when ``optimizer.iterations`` reaches the value.
"""

import os
import signal
import sys


def torch_job(logdir, ckpt, start, stop, kill_after=-1):
    import torch

    import tb_gradcheck.torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), 0.1)
    if start:
        saved = torch.load(ckpt)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        assert saved["step"] == start
    writer = tb_gradcheck.torch.GradientWriter(logdir, model)
    data = torch.Generator().manual_seed(1000 + start)
    for step in range(start, stop):
        optimizer.zero_grad()
        model(torch.randn(16, 4, generator=data)).square().mean().backward()
        writer.write(step)
        print("norm", step, float(model[0].weight.grad.norm()), flush=True)
        optimizer.step()
        if (step + 1) % 5 == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}, ckpt)
        if step == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
    writer.close()


def keras_job(root, kill_at):
    import keras
    import numpy as np

    import tb_gradcheck.keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    x = np.random.default_rng(0).normal(size=(20, 4)).astype("float32")

    class Kill(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    callbacks = [
        tb_gradcheck.keras.GradientCallback(os.path.join(root, "logs")),
        keras.callbacks.BackupAndRestore(os.path.join(root, "backup")),
        Kill(),
    ]
    model.fit(x, x[:, :1], batch_size=4, epochs=3, callbacks=callbacks, verbose=0)


if __name__ == "__main__":
    if sys.argv[1] == "torch":
        torch_job(sys.argv[2], sys.argv[3], *map(int, sys.argv[4:]))
    else:
        keras_job(sys.argv[2], int(sys.argv[3]))

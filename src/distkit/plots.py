"""matplotlib figures. Each function returns the figure; the caller shows or saves it."""
from __future__ import annotations

import matplotlib.pyplot as plt


def learning_curves(results_list, labels=None):
    """Train loss, validation loss and validation accuracy per epoch, one line per run.

    ``results_list``: results dicts as returned by ``distkit.launch.run``."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for i, res in enumerate(results_list):
        label = labels[i] if labels else f"{res['backend']} x{res['world_size']}"
        epochs = [h["epoch"] for h in res["history"]]
        axes[0].plot(epochs, [h["train_loss"] for h in res["history"]], marker="o", label=label)
        axes[1].plot(epochs, [h["val_loss"] for h in res["history"]], marker="o", label=label)
        axes[2].plot(epochs, [h["val_accuracy"] for h in res["history"]], marker="o", label=label)
    for ax, title in zip(axes, ["train loss (running avg)", "validation loss", "validation accuracy"]):
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    axes[2].legend()
    fig.tight_layout()
    return fig

"""Exercise 14: the FLOPs of a training step, and the model FLOPs utilisation (MFU).

How fast is a run *for its model*? Tokens per second depend on the model's size; the
**model FLOPs utilisation** does not: the floating-point operations the model's
arithmetic needs per second at the measured speed, divided by what the machine can do
(its peak FLOP/s). ``distkit train --dataset text --model gpt`` reports it; here you
compute it yourself, for the kit's GPT (:class:`distkit.builtin.models.GPT`).

Count what a training step of the whole run computes:

- A product of an (m x k) matrix with a (k x n) matrix costs ``2 m k n`` FLOPs (a
  multiply and an add each). A weight matrix applied to one token's vector therefore
  costs 2 FLOPs per weight in the forward. The backward computes two products of the
  same size per weight matrix: the gradient of its input and the gradient of the weight.
- N is the number of parameters that take part in matrix products: every parameter
  except the two embedding tables (``model.tok_emb`` and ``model.pos_emb``): a table
  lookup does no arithmetic. (Biases and LayerNorm weights are counted in N too: they
  are too few to matter.)
- Attention also multiplies activations by activations, with no weights: per layer and
  per sequence of T tokens, ``Q K^T`` ((T x d) by (d x T)) and ``A V`` ((T x T) by
  (T x d)); count the full T x T products (the causal mask does not save them here),
  and the backward as twice the forward again.
- Every one of ``world_size`` processes trains ``batch_per_rank`` sequences of
  ``model.block_size`` tokens per step.

Task:

1. ``step_flops(model, batch_per_rank, world_size)``: the FLOPs of one training step
   (forward and backward) of the whole run, every process together. Read the sizes from
   the model: ``model.n_layer``, ``model.d_model``, ``model.block_size`` (T), and its
   parameters (``model.named_parameters()``).
2. ``mfu(flops_per_step, step_time_ms, peak_flops)``: the model FLOPs utilisation as a
   fraction (0.25, not 25): ``flops_per_step`` done every ``step_time_ms``
   MILLIseconds, against ``peak_flops`` FLOP per SECOND. ``peak_flops`` is the whole
   run's peak, every device together (one device's peak x the number of devices, as
   ``distkit train`` measures it: every process's matmul FLOP/s, summed), because
   ``flops_per_step`` is the whole run's work. So ``mfu`` needs no world size and no
   process group: it returns the same number on every rank, and works with one process
   (whose peak is then its one device's).

The check counts the FLOPs torch itself executes in a step (``FlopCounterMode``, in one
process, on the whole run's batch) and times a real step against a measured matmul peak.

Check it:  pytest exercises -m ex14     (or: distkit check 14)
Stuck?     distkit check 14 --hint     (or read exercises/hints.md)
"""


def step_flops(model, batch_per_rank, world_size):
    """FLOPs of one training step (forward and backward) of the whole run."""
    # TODO: N (parameters but the embedding tables); FLOPs per token for the weights
    # (forward and backward) and for attention's two products; times every token of the step.
    raise NotImplementedError("exercise 14: write step_flops")


def mfu(flops_per_step, step_time_ms, peak_flops):
    """Model FLOPs utilisation, a fraction: achieved FLOP/s over the peak FLOP/s."""
    # TODO: FLOP/s achieved (mind the units of step_time_ms), over peak_flops.
    raise NotImplementedError("exercise 14: write mfu")

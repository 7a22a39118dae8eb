"""Wrong answers to exercises 09 (a pipeline written with send/recv, one stage per rank) and
11 (a ``torch.distributed.pipelining`` schedule and its bubble), by issue 35's families, in
the format of ``WRONG_ANSWERS`` in test_exercises.py, which grades them with the others:
(exercise, what the learner did, the change to the solution, what the learner must read).

``FAMILY`` tags every wrong answer of 09 and 11 wherever it is listed (test_exercises.py,
wrong_answers_layouts.py, here); ``APPLIES`` / ``NOT_APPLICABLE`` decide each family for
both exercises (tests/wrong_answer_families.py reads them).
"""

# A correct N-stage answer with three branches (first, middle, last), as a learner who
# writes each role apart would; the wrong answers below change one branch of it.
_THREE_BRANCHES = '''
def pipeline_step(stage, inputs, targets, activation_shape, n_microbatches):
    rank, world_size = idist.get_rank(), idist.get_world_size()
    sends, total = [], 0.0

    def receive(src):
        x = torch.empty(activation_shape, device=idist.device())
        dist.recv(x, src=src)
        return x

    if world_size == 1:
        for x, y in zip(inputs, targets):
            loss = F.cross_entropy(stage(x), y) / n_microbatches
            loss.backward()
            total += loss.item()
        return total
    if rank == 0:
        outputs = []
        for x in inputs:
            out = stage(x)
            sends.append(dist.isend(out.detach(), dst=1))
            outputs.append(out)
        for out in outputs:
            out.backward(receive(rank + 1))
    elif rank < world_size - 1:
%(MIDDLE)s
    else:
        for y in targets:
            a = receive(rank - 1).requires_grad_()
            loss = F.cross_entropy(stage(a), y) / n_microbatches
            loss.backward()
            total += loss.item()
            sends.append(dist.isend(a.grad, dst=rank - 1))
    for request in sends:
        request.wait()
    return total if rank == world_size - 1 else None
'''


def _three_branches(middle: str) -> str:
    return _THREE_BRANCHES % {"MIDDLE": middle.strip("\n")}


_MIDDLE_RECEIVES_ALL = '''
        received = [receive(rank - 1).requires_grad_() for _ in range(n_microbatches)]
        outputs = []
        for a in received:
            out = stage(a)
            sends.append(dist.isend(out.detach(), dst=rank + 1))
            outputs.append(out)
        for a, out in zip(received, outputs):
            out.backward(receive(rank + 1))
            sends.append(dist.isend(a.grad, dst=rank - 1))
'''
_MIDDLE_ONE_AT_A_TIME = '''
        for _ in range(n_microbatches):
            a = receive(rank - 1).requires_grad_()
            out = stage(a)
            sends.append(dist.isend(out.detach(), dst=rank + 1))
            out.backward(receive(rank + 1))
            sends.append(dist.isend(a.grad, dst=rank - 1))
'''

_LAYOUT_09 = [  # right in some layouts only
    ("09", "no middle stage: every stage after the first is the last",
     [("first, last = rank == 0, rank == world_size - 1", "first, last = rank == 0, rank != 0")],
     r"on 3 processes: stage 1 \(a middle stage, rank 1\) with 4 micro-batches: rank 1 raised TypeError: "
     r"'NoneType' object is not subscriptable\n\(on this rank inputs is None and targets is None; a middle "
     r"stage gets neither"),
    ("09", "the last stage is rank 1 (right with 2 stages)",
     [("first, last = rank == 0, rank == world_size - 1", "first, last = rank == 0, rank == 1")],
     r"on 3 processes: stage 1 \(a middle stage, rank 1\) with 4 micro-batches: rank 1 raised TypeError"),
    ("09", "the stage from the local rank (right on one node)",
     [("rank, world_size = idist.get_rank(), idist.get_world_size()",
       "rank, world_size = idist.get_local_rank(), idist.get_world_size()")],
     r"on 2 nodes x 2 processes: stage 2 \(a middle stage, rank 2\) with 4 micro-batches: rank 2 raised "
     r"TypeError: 'NoneType' object is not subscriptable"),
    ("09", "torch.distributed's rank and world size (raise with no process group)",
     [("rank, world_size = idist.get_rank(), idist.get_world_size()",
       "rank, world_size = dist.get_rank(), dist.get_world_size()")],
     r"on 1 process \(no process group\): stage 0 \(the only stage: first and last, rank 0\) with 4 "
     r"micro-batches: rank 0 raised ValueError: Default process group has not been initialized.*with one "
     r"process there is no process group"),
    ("09", "the peers of 2 stages written in (dst=1, src=0)",
     [("dist.recv(x, src=rank - 1)", "dist.recv(x, src=0)"),
      ("dist.isend(out.detach(), dst=rank + 1)", "dist.isend(out.detach(), dst=1)"),
      ("dist.recv(grad, src=rank + 1)", "dist.recv(grad, src=1)"),
      ("dist.isend(received[k].grad, dst=rank - 1)", "dist.isend(received[k].grad, dst=0)")],
     r"on 3 processes: stage 1 \(a middle stage, rank 1\) with 4 micro-batches called dist.isend to rank 1: "
     r"a stage exchanges only with its neighbours \(rank 0 and rank 2\)"),
    ("09", "the first stage is never the last (one process sends to a rank 1 that does not exist)",
     [("first, last = rank == 0, rank == world_size - 1",
       "first = rank == 0\n    last = not first and rank == world_size - 1")],
     r"on 1 process \(no process group\): stage 0 \(the only stage: first and last, rank 0\) with 4 "
     r"micro-batches called dist.isend: with one process \(no process group\) rank 0 is the first and the last"),
    ("09", "the world size from the processes per node (right on one node)",
     [("rank, world_size = idist.get_rank(), idist.get_world_size()",
       "rank, world_size = idist.get_rank(), idist.get_nproc_per_node()")],
     r"on 2 nodes x 2 processes: stage [123] \(.*\) with 4 micro-batches"),
    ("09", "the loss divided by 4, the example's micro-batch count",
     [("out = F.cross_entropy(out, targets[k]) / n_microbatches", "out = F.cross_entropy(out, targets[k]) / 4")],
     r"on 2 processes \(2 stages, one per rank\), 3 micro-batches: stage 0 \(the first stage, rank 0\)'s "
     r"gradients\[0\]: \d+ of 40 entries differ"),
]
_STRUCTURE_09 = [  # the right gradients computed the wrong way
    ("09", "a middle stage receives every micro-batch before computing (right gradients)",
     _three_branches(_MIDDLE_RECEIVES_ALL),
     r"on 3 processes \(3 stages, one per rank\), 4 micro-batches: stage 1 \(a middle stage, rank 1\) "
     r"received all 4 micro-batches before computing on the first: the gradients are right"),
    ("09", "a middle stage waits for each gradient before passing the next micro-batch on (right gradients)",
     _three_branches(_MIDDLE_ONE_AT_A_TIME),
     r"on 3 processes \(3 stages, one per rank\), 4 micro-batches: stage 1 \(a middle stage, rank 1\) waited "
     r"for the gradient of micro-batch 1 before it sent micro-batch 2 on"),
    ("09", "every forward computed before the first send (right gradients)", '''
def pipeline_step(stage, inputs, targets, activation_shape, n_microbatches):
    rank, world_size = idist.get_rank(), idist.get_world_size()
    first, last = rank == 0, rank == world_size - 1
    received, outputs, sends, total = [], [], [], 0.0
    for k in range(n_microbatches):
        if first:
            x = inputs[k]
        else:
            x = torch.empty(activation_shape, device=idist.device())
            dist.recv(x, src=rank - 1)
            x.requires_grad_()
        received.append(x)
        outputs.append(stage(x))
    if last:
        outputs = [F.cross_entropy(out, y) / n_microbatches for out, y in zip(outputs, targets)]
        total = sum(loss.item() for loss in outputs)
    else:
        sends = [dist.isend(out.detach(), dst=rank + 1) for out in outputs]
    for x, out in zip(received, outputs):
        if last:
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, src=rank + 1)
            out.backward(grad)
        if not first:
            sends.append(dist.isend(x.grad, dst=rank - 1))
    for request in sends:
        request.wait()
    return total if last else None
''', r"on 2 processes \(2 stages, one per rank\), 4 micro-batches: stage 0 \(the first stage, rank 0\) "
     r"computed the forward of every micro-batch before it sent the first on to rank 1"),
    ("09", "blocking sends both ways: the last stage sends a gradient back while the first still sends (deadlock)", '''
def pipeline_step(stage, inputs, targets, activation_shape, n_microbatches):
    rank, world_size = idist.get_rank(), idist.get_world_size()
    first, last = rank == 0, rank == world_size - 1
    received, outputs, total = [], [], 0.0
    for k in range(n_microbatches):
        if first:
            x = inputs[k]
        else:
            x = torch.empty(activation_shape, device=idist.device())
            dist.recv(x, src=rank - 1)
            x.requires_grad_()
        out = stage(x)
        if last:  # the loss is here: its backward at once, the gradient straight back
            loss = F.cross_entropy(out, targets[k]) / n_microbatches
            loss.backward()
            total += loss.item()
            if not first:
                dist.send(x.grad, dst=rank - 1)
        else:
            dist.send(out.detach(), dst=rank + 1)
            received.append(x)
            outputs.append(out)
    for x, out in zip(received, outputs):
        grad = torch.empty_like(out)
        dist.recv(grad, src=rank + 1)
        out.backward(grad)
        if not first:
            dist.send(x.grad, dst=rank - 1)
    return total if last else None
''', r"on 2 processes: stage [01] \(the (first|last) stage, rank [01]\) with 4 micro-batches waited \d+ s in a "
     r"blocking dist.send to rank [01], which never received it: a blocking send returns only once the peer "
     r"has posted the matching recv"),
]
_ROBUST_09 = [  # what the check must survive and describe
    ("09", "the micro-batch losses returned as a list",
     [("    total = 0.0\n", "    total = []\n"), ("total += out.item()", "total.append(out.item())")],
     r"on 2 processes \(2 stages, one per rank\), 4 micro-batches: stage 1 \(the last stage, rank 1\) returned "
     r"a list of 4: return the sum of the micro-batches' scaled losses, one Python float"),
    ("09", "nothing returned (None on the last stage too)",
     [("    return total if last else None\n", "")],
     r"stage 1 \(the last stage, rank 1\)'s returned loss should be a number \(\d.*\), got None"),
    ("09", "the loss returned on every stage (0.0 on the others)",
     [("    return total if last else None\n", "    return total\n")],
     r"on 2 processes \(2 stages, one per rank\), 4 micro-batches: stage 0 \(the first stage, rank 0\) "
     r"returned 0.0: return None there"),
    ("09", "the received activations never require grad (raises: x.grad is None)",
     [("            x.requires_grad_()\n", "")],
     r"on 2 processes: stage 1 \(the last stage, rank 1\) with 4 micro-batches: rank 1 raised \w+Error: .*"
     r"a .grad on that line is None"),
    ("09", "only the last stage sends gradients back (a middle stage leaves the first waiting)",
     [("        if not first:\n            # isend again", "        if last and not first:\n            # isend again")],
     r"on 3 processes: stage 0 \(the first stage, rank 0\) with 4 micro-batches waited \d+ s in its receive "
     r"number 1 from rank 1, which never sent it"),
    ("09", "the receive buffer holds one sample's activations, not a micro-batch's",
     [("x = torch.empty(activation_shape, device=idist.device())",
       "x = torch.empty(activation_shape[1:], device=idist.device())")],
     r"on 2 processes: stage 1 \(the last stage, rank 1\) with 4 micro-batches posted a receive into a buffer of "
     r"shape \(8,\) from rank 0, but each micro-batch's activations, and their gradients, have activation_shape "
     r"\(3, 8\)"),
]
_DEVICE_09 = [  # code written for one machine (rejected here because this machine has no GPU)
    ("09", "the receive buffer on 'cuda'",
     [("x = torch.empty(activation_shape, device=idist.device())",
       'x = torch.empty(activation_shape, device="cuda")')],
     r"on 2 processes: stage 1 \(the last stage, rank 1\) with 4 micro-batches: rank 1 raised RuntimeError: "
     r"Found no NVIDIA driver.*Use idist.device\(\)"),
    ("09", "the receive buffer on the GPU of the global rank",
     [("x = torch.empty(activation_shape, device=idist.device())",
       'x = torch.empty(activation_shape, device=f"cuda:{rank}")')],
     r"on 2 processes: stage 1 \(the last stage, rank 1\) with 4 micro-batches: rank 1 raised RuntimeError: "
     r"Found no NVIDIA driver.*Use idist.device\(\)"),
    ("09", "torch.cuda.set_device(rank) first, as in a DDP script",
     [("    first, last = rank == 0, rank == world_size - 1\n",
       "    first, last = rank == 0, rank == world_size - 1\n    torch.cuda.set_device(rank)\n")],
     r"on 2 processes: stage 0 \(the first stage, rank 0\) with 4 micro-batches: rank 0 raised RuntimeError: "
     r"Found no NVIDIA driver.*Use idist.device\(\)"),
    ("09", "the GPU chosen as rank % torch.cuda.device_count()",
     [("x = torch.empty(activation_shape, device=idist.device())",
       'x = torch.empty(activation_shape, device=torch.device("cuda", rank % torch.cuda.device_count()))')],
     r"on 2 processes: stage 1 \(the last stage, rank 1\) with 4 micro-batches: rank 1 raised ZeroDivisionError.*"
     r"the line that raised names a GPU \(cuda\): this machine has none"),
    ("09", "the stage moved to the GPU of the local rank",
     [("    first, last = rank == 0, rank == world_size - 1\n",
       '    first, last = rank == 0, rank == world_size - 1\n    stage.to(f"cuda:{idist.get_local_rank()}")\n')],
     r"on 2 processes: stage 0 \(the first stage, rank 0\) with 4 micro-batches: rank 0 raised RuntimeError: "
     r"Found no NVIDIA driver.*Use idist.device\(\)"),
    ("09", "the receive buffer in pinned memory (for faster GPU copies)",
     [("x = torch.empty(activation_shape, device=idist.device())",
       "x = torch.empty(activation_shape).pin_memory()")],
     r"on 2 processes: stage 1 \(the last stage, rank 1\) with 4 micro-batches: rank 1 raised RuntimeError: "
     r"Found no NVIDIA driver.*Use idist.device\(\)"),
    ("09", "the first stage's inputs moved with .cuda()",
     [("            x = inputs[k]\n", "            x = inputs[k].cuda()\n")],
     r"on 2 processes: stage 0 \(the first stage, rank 0\) with 4 micro-batches: rank 0 raised RuntimeError: "
     r"Found no NVIDIA driver.*Use idist.device\(\)"),
]
_INPUTS_09 = [  # right on benign values only: values a narrower dtype holds, logits of order 1
    ("09", "activations sent as bfloat16 (half the bytes)",
     [("x = torch.empty(activation_shape, device=idist.device())",
       "x = torch.empty(activation_shape, device=idist.device(), dtype=torch.bfloat16)"),
      ("            x.requires_grad_()\n", "            x = x.float().requires_grad_()\n"),
      ("dist.isend(out.detach(), dst=rank + 1)", "dist.isend(out.detach().bfloat16(), dst=rank + 1)")],
     r"stage \d \(.*\)'s gradients.*entries differ.* Stage 0 sent bfloat16 tensors \(dist.isend\): bfloat16 keeps "
     r"8 bits of mantissa"),
    ("09", "activations sent as float16 (half the bytes)",
     [("x = torch.empty(activation_shape, device=idist.device())",
       "x = torch.empty(activation_shape, device=idist.device(), dtype=torch.float16)"),
      ("            x.requires_grad_()\n", "            x = x.half().float().requires_grad_()\n"),
      ("dist.isend(out.detach(), dst=rank + 1)", "dist.isend(out.detach().half(), dst=rank + 1)")],
     r"stage \d \(.*\)'s gradients.*entries differ.* Stage 0 sent float16 tensors \(dist.isend\): float16 keeps "
     r"11 bits of mantissa"),
    ("09", "gradients sent back as bfloat16",
     [("grad = torch.empty_like(outputs[k])", "grad = torch.empty_like(outputs[k], dtype=torch.bfloat16)"),
      ("            outputs[k].backward(grad)\n", "            outputs[k].backward(grad.float())\n"),
      ("dist.isend(received[k].grad, dst=rank - 1)", "dist.isend(received[k].grad.bfloat16(), dst=rank - 1)")],
     r"stage 0 \(the first stage, rank 0\)'s gradients.*entries differ.* Stage 1 sent bfloat16 tensors"),
    ("09", "gradients sent back as float16",
     [("grad = torch.empty_like(outputs[k])", "grad = torch.empty_like(outputs[k], dtype=torch.float16)"),
      ("            outputs[k].backward(grad)\n", "            outputs[k].backward(grad.float())\n"),
      ("dist.isend(received[k].grad, dst=rank - 1)", "dist.isend(received[k].grad.half(), dst=rank - 1)")],
     r"stage 0 \(the first stage, rank 0\)'s gradients.*entries differ.* Stage 1 sent float16 tensors"),
    ("09", "the cross-entropy written by hand with exp (overflows on large logits)",
     [("out = F.cross_entropy(out, targets[k]) / n_microbatches",
       "probs = out.exp() / out.exp().sum(dim=1, keepdim=True)\n"
       "            out = -probs[torch.arange(len(targets[k])), targets[k]].log().mean() / n_microbatches")],
     r"stage \d \(.*\)'s gradients.* holds NaN .*F.cross_entropy \(stable for logits of any size\)"),
    ("09", "the log of the softmax (underflows on large logits)",
     [("out = F.cross_entropy(out, targets[k]) / n_microbatches",
       "out = F.nll_loss(torch.log(F.softmax(out, dim=1)), targets[k]) / n_microbatches")],
     r"stage \d \(.*\)'s gradients.* holds NaN .*F.cross_entropy \(stable for logits of any size\)"),
]

_STRUCTURE_11 = [  # the right numbers, another schedule
    ("11", "one schedule step per micro-batch (right gradients, the stages never overlap)", '''
def pipeline_step(stage_module, stage_index, num_stages, inputs, targets, n_microbatches):
    stage = PipelineStage(stage_module, stage_index, num_stages, torch.device("cpu"))
    # one micro-batch per step: each loss divided by their number, so the gradients add up
    schedule = ScheduleGPipe(stage, n_microbatches=1,
                             loss_fn=lambda out, y: F.mse_loss(out, y) / n_microbatches)
    losses = []
    for k in range(n_microbatches):
        if stage_index == 0:
            schedule.step(inputs.chunk(n_microbatches)[k])
        elif stage_index < num_stages - 1:
            schedule.step()
        else:
            schedule.step(target=targets.chunk(n_microbatches)[k], losses=losses)
    return torch.stack(losses).sum().item() if stage_index == num_stages - 1 else None
''', r"on 3 processes \(3 stages, one per rank\), n_microbatches=3: stage 0 \(the first stage, rank 0\) posted "
     r"the receive of micro-batch 1's gradient after sending 1 of 3 micro-batches on"),
    ("11", "n_microbatches=1: the whole batch as one micro-batch (right gradients)",
     [("ScheduleGPipe(stage, n_microbatches=n_microbatches,", "ScheduleGPipe(stage, n_microbatches=1,")],
     r"with n_microbatches=4 and a batch of 16, rank 0 sent 1 activation tensor\(s\) of shape \(16, 8\), not 4"),
    ("11", "Schedule1F1B instead of ScheduleGPipe (the same numbers, another schedule)",
     [("ScheduleGPipe(stage, n_microbatches=n_microbatches,", "Schedule1F1B(stage, n_microbatches=n_microbatches,"),
      ("from torch.distributed.pipelining import PipelineStage, ScheduleGPipe",
       "from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe")],
     r"on 3 processes \(3 stages, one per rank\), n_microbatches=3: stage 1 \(a middle stage, rank 1\) posted "
     r"the receive of micro-batch 1's gradient after sending 2 of 3 micro-batches on: the numbers may be right, "
     r"but that is not the GPipe schedule"),
]
_ROBUST_11 = [  # what the check must survive and describe
    ("11", "the list of losses returned",
     [("return torch.stack(losses).mean().item()", "return losses")],
     r"the last stage returned a list of 4: return the mean of the micro-batch losses as a Python float"),
    ("11", "nothing returned on the last stage",
     [("    return torch.stack(losses).mean().item()\n", "")],
     r"the last stage returned None: return the mean of the micro-batch losses as a Python float"),
    ("11", "0.0 returned on the first stage",
     [("schedule.step(inputs)  # cut into micro-batches and sent on\n        return None",
       "schedule.step(inputs)  # cut into micro-batches and sent on\n        return 0.0")],
     r"rank 0 returned 0.0: return None there \(the loss is computed on the last stage\)"),
    ("11", "the mean of the losses taken on every stage (raises on the first)", '''
def pipeline_step(stage_module, stage_index, num_stages, inputs, targets, n_microbatches):
    stage = PipelineStage(stage_module, stage_index, num_stages, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=n_microbatches, loss_fn=F.mse_loss)
    losses = []
    if stage_index == 0:
        schedule.step(inputs)
    elif stage_index < num_stages - 1:
        schedule.step()
    else:
        schedule.step(target=targets, losses=losses)
    return torch.stack(losses).mean().item()
''', r"rank 0 raised RuntimeError: stack expects a non-empty TensorList"),
    ("11", "bubble_fraction returns a tensor",
     [("return (stages - 1) / (microbatches + stages - 1)",
       "return torch.tensor((stages - 1) / (microbatches + stages - 1))")],
     r"bubble_fraction\(2, 2\) returned a float32 tensor of shape \(\), not a number: return a Python float"),
]

WRONG_ANSWERS = _LAYOUT_09 + _STRUCTURE_09 + _ROBUST_09 + _DEVICE_09 + _INPUTS_09 + _STRUCTURE_11 + _ROBUST_11

FAMILY = {
    # 09: tests/exercises/test_exercises.py
    ("09", "the micro-batch losses are not scaled"): "understanding",
    ("09", "the gradient sent back divided by the micro-batches again"): "understanding",
    ("09", "stage 0 never backpropagates"): "understanding",
    ("09", "no micro-batches: the whole batch at once"): "structure",
    ("09", "one micro-batch at a time: the stages never overlap"): "structure",
    ("09", "a tensor returned"): "robust",
    ("09", "the gradients paired with the wrong micro-batches"): "understanding",
    ("09", "rank 1 receives every micro-batch before computing any (right gradients, no overlap)"): "structure",
    # 11: tests/exercises/test_exercises.py
    ("11", "(p-1)/m"): "understanding",
    ("11", "(p-1)/m on 2 stages only, the right formula otherwise"): "understanding",
    ("11", "a formula for 2 stages only"): "layout",
    ("11", "n_microbatches ignored"): "structure",
    ("11", "the sum of the losses"): "understanding",
    ("11", "the mean loss divided by the number of micro-batches again"): "understanding",
    ("11", "a tensor returned"): "robust",
    ("11", "a hard-coded 4 micro-batches"): "structure",
    ("11", "micro-batches of 4 samples, whatever n_microbatches says"): "structure",
    ("11", "the rule of thumb m = 2p instead of n_microbatches"): "structure",
    ("11", "the loss divided by the number of micro-batches"): "understanding",
    ("11", "the micro-batch gradients summed"): "understanding",
    # 11: tests/wrong_answers_layouts.py
    ("11", "no middle stage: every stage after the first is treated as the last"): "layout",
    ("11", "the last stage is stage 1 (right with 2 stages)"): "layout",
    ("11", "2 stages written in"): "layout",
    ("11", "the stage from the local rank (right on one node)"): "layout",
    ("11", "as many micro-batches as stages (right when they are equal)"): "layout",
    ("11", "the middle stages skip their step (only the ends run the schedule)"): "layout",
}
FAMILY.update({("09", name): family for family, answers in (
    ("layout", _LAYOUT_09), ("structure", _STRUCTURE_09), ("robust", _ROBUST_09), ("device", _DEVICE_09),
    ("inputs", _INPUTS_09)) for _, name, *_ in answers})
FAMILY.update({("11", name): family for family, answers in (("structure", _STRUCTURE_11), ("robust", _ROBUST_11))
               for _, name, *_ in answers})

APPLIES = {
    "09": ("layout", "structure", "robust", "device", "inputs"),
    "11": ("layout", "structure", "robust"),
}
NOT_APPLICABLE = {
    ("11", "inputs"): "the learner computes no value of the model: the schedule runs the forward, the "
                      "loss, the sends and the backward; the learner's own arithmetic is the bubble formula "
                      "(compared with the reference for 1 to 8 stages and 1 to 16 micro-batches) and the mean "
                      "of the losses, which no input makes exact or inexact",
    ("11", "device"): "the task fixes the device: the stage is a PipelineStage on the CPU under gloo, and the "
                      "schedule itself makes and moves every tensor it sends; the learner hands no tensor to "
                      "torch.distributed",
}

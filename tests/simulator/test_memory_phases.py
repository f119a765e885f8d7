"""The memory model counts what the engine holds at the same time (issue 19): gradients only once a
backward has made them, the loss's working memory as its cross-entropy allocates it, the optimizer
step's temporaries, and a tied matrix summed once, in the embedding group (with its egress)."""

import pytest

from sailor_core.network import default_network
from sailor_core.regimes import get_regime
from sailor_core.simulator import simulate
from sailor_core.simulator import stage as st
from sailor_core.simulator.memory import stage_memory
from tests.simulator.helpers import db_of, flat_network, hand_profile, plan

BF16 = get_regime("torch-bf16-autocast-adamw")  # 16 B/param, fused AdamW, torch's cross-entropy
CPU = get_regime("torch-fp32-adamw")  # the CPU engine: AdamW(foreach=False), in-place cross-entropy
MATRIX = 512 * 64  # tiny's tied vocabulary matrix (its last stage holds a copy)
LOGITS = 64 * 512  # one sequence of 64 tokens x 512 vocabulary rows


def _rep(zone="local", gpu="A100-40"):
    return {"gpu": gpu, "tp": 1, "zone": zone}


def test_last_stage_with_one_microbatch_has_no_gradients_beside_its_forward():
    # Last stage [2, 4) of tiny: block (2000 params, 1000 B activations) + head (1000, 500) + the
    # tied copy.  One micro-batch: no forward runs after a backward; the peak is the head's
    # backward, which holds every activation, the loss's working memory and the gradients the head
    # makes (its own and the copy's) but not yet the block's.
    prof = hand_profile("A100-40")
    held = 2000 + 1000 + MATRIX
    one = stage_memory(prof, 2, 4, 1, BF16, 1 << 40, num_microbatches=1)
    loss = 10 * LOGITS  # the bf16 logits the output references (2 B) + the fp32 gradients (8 B)
    assert one.state_bytes == held * 12 + (1000 + MATRIX) * 4
    assert one.activation_bytes == 1000 + 500 and one.loss_working_bytes == loss
    # Two micro-batches: the second forward runs beside every gradient.
    two = stage_memory(prof, 2, 4, 1, BF16, 1 << 40, num_microbatches=2)
    assert two.state_bytes == held * 16
    assert two.peak_bytes - one.peak_bytes == 2000 * 4
    # Unknown (0): the steady state, as before.
    assert stage_memory(prof, 2, 4, 1, BF16, 1 << 40).peak_bytes == two.peak_bytes


def test_all_forwards_first_keeps_k_minus_one_beside_the_first_backward():
    # Stage [1, 3) of tiny with K = 2 and 2 micro-batches: both forwards run before any backward.
    prof = hand_profile("A100-40")
    one = 1000 + 1000 + 4096  # its layers' activations and its output, kept until the gradient returns
    mem = stage_memory(prof, 1, 3, 2, BF16, 1 << 40, num_microbatches=2)
    steady = stage_memory(prof, 1, 3, 2, BF16, 1 << 40, num_microbatches=3)
    # The first backward's last layer (layer 1) holds its activations and every gradient.
    best = max(one + (1000 + 1000 + 4096) + 2000 * 4,  # layer 2 runs backward: its grads only
               one + (1000 + 4096) + 4000 * 4)  # layer 1: all grads, its own activations
    assert mem.activation_bytes + mem.state_bytes - 4000 * 12 == best
    assert steady.peak_bytes > mem.peak_bytes


def test_cpu_engine_loss_holds_nothing_beyond_the_head_and_its_optimizer_step_can_be_the_peak():
    prof = hand_profile("A100-40")
    last = stage_memory(prof, 2, 4, 1, CPU, 1 << 40, num_microbatches=2)
    # The engine's cross-entropy turns its saved softmax into the gradient in place; and with these
    # tiny activations the optimizer step is the peak: single-tensor AdamW holds two temporaries of
    # the largest tensor (the 512 x 64 copy) beside the weights, gradients and moments.
    assert last.loss_working_bytes == 0 and CPU.loss_working_bytes_per_logit == 0
    assert last.optimizer_working_bytes == 2 * MATRIX * 4
    assert last.activation_bytes == 0 and last.comm_bytes == 0
    assert last.state_bytes == (2000 + 1000 + MATRIX) * 16
    # A stage without a vocabulary matrix: its largest tensor is tiny's FFN matrix, 256 x 64, so
    # the step holds two fp32 temporaries of it; but a later backward's start holds more: the down
    # projection's input gradient (64 tokens x 256) and its weight's new gradient (64 x 256), fp32,
    # beside the activations and buffers.
    middle = stage_memory(prof, 1, 2, 1, CPU, 1 << 40, num_microbatches=2)
    step = middle.state_bytes + 2 * 256 * 64 * 4
    assert middle.backward_working_bytes == 64 * 256 * 4 + 64 * 256 * 4
    assert middle.optimizer_working_bytes == 0 and middle.allocated_bytes > step
    # A first backward makes the weight's gradient itself: the input's only; the embedding makes
    # none but its weight's, the head none but the loss's (counted apart).
    from sailor_core.simulator.memory import backward_working_bytes

    assert backward_working_bytes("tiny", 1, 1, 64, 1, 4, 4, False) == 64 * 256 * 4
    assert backward_working_bytes("tiny", 1, 1, 64, 0, 4, 4, True) == 512 * 64 * 4
    assert backward_working_bytes("tiny", 1, 1, 64, 0, 4, 4, False) == 0
    assert backward_working_bytes("tiny", 1, 1, 64, 3, 4, 4, True) == 0
    # Fused AdamW (the GPU regime) makes none.
    assert stage_memory(prof, 2, 4, 1, BF16, 1 << 40).optimizer_working_bytes == 0


def _tied_plan(zone_last="local", dp=2):
    stages = [{"layers": [0, 2], "replicas": [_rep()] * dp},
              {"layers": [2, 4], "replicas": [_rep(zone_last)] * dp}]
    return plan(stages, gbs=4)


def test_the_tied_matrix_is_summed_once_in_the_embedding_group():
    # Layer 0 holds tiny's matrix (40000 params include its 32768); the engine leaves it out of
    # both stages' DP sums and their DP buckets, and sums it in the embedding group.
    prof = hand_profile("A100-40", params=(40000, 2000, 2000, 1000))
    r = simulate(_tied_plan(), profiles=db_of(prof), network=flat_network())
    first, last = r.stages
    assert first.dp_sync_bytes == (40000 + 2000 - MATRIX) * 4
    assert last.dp_sync_bytes == (2000 + 1000) * 4
    assert first.replicas[0].memory.comm_bytes - 4096 == (40000 + 2000 - MATRIX) * 4  # + its gradient's receive
    assert last.replicas[0].memory.comm_bytes - 4096 == (2000 + 1000) * 4  # + the next input's receive
    assert st.tied_sync_bytes(prof, BF16) == MATRIX * 4
    # One stage: no embedding group, the DP sum carries the matrix.
    whole = plan([{"layers": [0, 4], "replicas": [_rep()] * 2}], gbs=4)
    assert simulate(whole, profiles=db_of(prof), network=flat_network()).stages[0].dp_sync_bytes == 45000 * 4


def test_the_tied_sum_pays_egress_only_when_first_and_last_stage_are_in_different_zones():
    net = default_network()
    tied = MATRIX * 4.0
    members = [("us-central1-a", "A100-40", 1), ("us-west1-b", "A100-40", 1)]
    price = net.egress_usd_per_byte("us-central1-a", "us-west1-b")
    back = net.egress_usd_per_byte("us-west1-b", "us-central1-a")
    # A ring of 2: each hop carries 2 (2 - 1) / 2 = 1 x the matrix, and both leave a zone.
    assert st.tied_sync_egress_terms(net, tied, members) == pytest.approx([tied * back, tied * price])
    assert st.tied_sync_egress_terms(net, tied, [members[0], members[0]]) == []
    # In a plan: stage 0's replicas in one zone, stage 1's in another; the p2p egress is the same
    # for the untied twin (the tied ring is the only difference).
    prof = hand_profile("A100-40", params=(40000, 2000, 2000, 1000))
    stages = [{"layers": [0, 2], "replicas": [_rep("us-central1-a")]},
              {"layers": [2, 4], "replicas": [_rep("us-west1-b")]}]
    far = simulate(plan(stages, gbs=4), profiles=db_of(prof), network=net)
    p2p = 4 * 4096 * (price + back)  # 4 micro-batches, activation out and gradient back
    assert far.egress_usd_per_iteration == pytest.approx(p2p + tied * (price + back))
    near = simulate(plan([{**s, "replicas": [_rep("us-central1-a")]} for s in stages], gbs=4),
                    profiles=db_of(prof), network=net)
    assert near.egress_usd_per_iteration == 0.0

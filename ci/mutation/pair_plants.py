"""Plants in the shared-memory exchange of two ranks on one host (``ranks/sides/two_ranks/shared_pair.py``):
an exchange that is never taken, one taken for 16-bit tensors whose sum gloo rounds otherwise, an
average left a sum, each rank's own addend first (two NaNs then differ between replicas), sizes
never checked, and a segment's file left in ``/dev/shm``.

Why: each changes no verdict on the default matrix (its tensors are too small for the exchange)
and would show only as lost speed, a reference whose replicas differ, or a leak; the tests named
kill each in seconds.
"""

from __future__ import annotations

from ci.mutation.edits import Edit, Plant

_PAIR = "suites/parity/test_shared_pair.py"
_FILE = "ranks/sides/two_ranks/shared_pair.py"


def _edit(old: str, new: str) -> Edit:
    return Edit(file=_FILE, old=old, new=new, package="harness/parity")


PAIR_PLANTS: tuple[Plant, ...] = (
    Plant(
        name="cost_shared_pair_never_taken",
        bug="every large tensor of the reference still goes through gloo's sockets",
        edits=(
            _edit(
                '        tensor.device.type == "cpu"\n',
                '        tensor.device.type == "planted"\n',
            ),
        ),
        tests=(f"{_PAIR}::test_a_large_float32_tensor_goes_through_shared_memory_with_gloos_bits",),
    ),
    Plant(
        name="cost_shared_pair_sums_bfloat16",
        bug="a bfloat16 sum goes through shared memory, rounded as torch's addition rounds it",
        edits=(
            _edit(
                "DTYPES = (torch.float32, torch.float64)\n",
                "DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)  # planted\n",
            ),
        ),
        tests=(f"{_PAIR}::test_a_low_precision_sum_stays_on_gloo",),
    ),
    Plant(
        name="cost_shared_pair_average_left_a_sum",
        bug="an average through shared memory is the ranks' sum, not halved",
        edits=(
            _edit(
                "        tensor.div_(2)  # gloo's average",
                "        pass  # planted: gloo's average",
            ),
        ),
        tests=(f"{_PAIR}::test_a_large_float32_tensor_goes_through_shared_memory_with_gloos_bits",),
    ),
    Plant(
        name="cost_shared_pair_own_addend_first",
        bug="each rank adds its peer's slot to its own, so two NaNs sum to another NaN on each rank",
        edits=(
            _edit(
                "            torch.add(slots[0][: part.numel()], slots[1][: part.numel()], out=part)\n",
                "            torch.add(slots[self.me][: part.numel()], slots[1 - self.me][: part.numel()], out=part)  # planted\n",
            ),
        ),
        tests=(f"{_PAIR}::test_two_nans_sum_to_the_same_bits_on_both_ranks",),
    ),
    Plant(
        name="cost_shared_pair_sizes_unchecked",
        bug="ranks that send chunks of different sizes add whatever their peer's slot holds",
        edits=(
            _edit(
                "        if sizes[0] != -sizes[1] or sizes[2] != -sizes[3]:\n",
                "        if False:  # planted\n",
            ),
        ),
        tests=(f"{_PAIR}::test_ranks_that_send_different_sizes_both_raise_naming_the_sizes",),
    ),
    Plant(
        name="cost_shared_pair_trusts_any_file_of_its_name",
        bug="a peer that maps another file of the segment's name (another /dev/shm) sums stale bytes",
        edits=(
            _edit(
                "        if segment is not None and bytes(segment[: len(token)].tolist()) != token:\n",
                "        if False:  # planted\n",
            ),
        ),
        tests=(f"{_PAIR}::test_a_segment_is_unlinked_once_made_and_ranks_that_cannot_share_it_use_gloo",),
    ),
    Plant(
        name="cost_shared_pair_file_left_behind",
        bug="the segment's file stays in /dev/shm after both ranks mapped it",
        edits=(
            _edit(
                "        os.unlink(made[0])  # both mapped it",
                "        pass  # planted: both mapped it",
            ),
        ),
        tests=(f"{_PAIR}::test_a_segment_is_unlinked_once_made_and_ranks_that_cannot_share_it_use_gloo",),
    ),
)

import pytest
import torch

from structinit.offsets import assign_offsets, check_kernel_size, impulse_maps, kernel_offsets, target_indices


def test_kernel_offsets_cover_the_kernel():
    assert sorted(kernel_offsets(3)) == [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
    assert len(set(kernel_offsets(5, "ordered"))) == 25
    assert kernel_offsets(5, "ordered")[0] == (0, 0)


def test_ordered_is_the_authors_order_for_3x3():
    # centre, up, right, left, down, then the diagonals
    assert kernel_offsets(3, "ordered") == [
        (0, 0),
        (-1, 0),
        (0, 1),
        (0, -1),
        (1, 0),
        (-1, -1),
        (-1, 1),
        (1, -1),
        (1, 1),
    ]


@pytest.mark.parametrize("heads,f", [(3, 3), (9, 3), (12, 3), (20, 3), (25, 5), (30, 5)])
def test_random_assignment_uses_every_offset_before_repeating(heads, f):
    offsets = assign_offsets(heads, f, "random", torch.Generator().manual_seed(1))
    pool = f * f
    first = offsets[: min(heads, pool)]
    assert len(set(first)) == len(first)
    if heads >= pool:
        assert set(offsets) == set(kernel_offsets(f))


def test_random_assignment_depends_on_the_seed_only():
    a = assign_offsets(9, 3, "random", torch.Generator().manual_seed(0))
    b = assign_offsets(9, 3, "random", torch.Generator().manual_seed(0))
    c = assign_offsets(9, 3, "random", torch.Generator().manual_seed(1))
    assert a == b and a != c


def test_impulse_maps_are_shifts_with_zero_padding():
    maps = impulse_maps([(0, 1)], (2, 3))[0]
    # token (r, c) -> index 3r + c; offset (0, +1): query (r, c) attends to (r, c + 1) unless c = 2
    expected = torch.zeros(6, 6)
    for r in range(2):
        for c in range(2):
            expected[3 * r + c, 3 * r + c + 1] = 1
    assert torch.equal(maps, expected)
    _, valid = target_indices([(0, 1)], (2, 3))
    assert valid.tolist() == [[True, True, False, True, True, False]]


@pytest.mark.parametrize("bad,error", [(4, ValueError), (0, ValueError), (9, ValueError), (3.0, TypeError)])
def test_bad_kernel_sizes(bad, error):
    with pytest.raises(error, match="kernel_size"):
        check_kernel_size(bad, (8, 8))

"""The package's torch-free layer (fa_course._capi) against the built library. No GPU, no PyTorch:
everything here is answered by the library before any CUDA call (fa_validate, and fa_forward's
checks). Run with FA_COURSE_LIB pointing at a built libfa2_capi.so (the ctest case `python.capi`
does) or against the installed package."""
import ctypes
import math
import os
import re

import pytest

from fa_course import _capi

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def stand_in(slot: int) -> int:
    """A fake device address, far from the others, 16-byte aligned; never dereferenced."""
    return slot << 44


def params(head_dim=64, heads_q=4, heads_kv=4, n_q=128, n_kv=128, batch=2, **kw):
    def contiguous(h, n):  # (B, H, N, D)
        return [h * n * head_dim, n * head_dim, head_dim, 1]

    strides = [contiguous(heads_q, n_q), contiguous(heads_kv, n_kv), contiguous(heads_kv, n_kv),
               contiguous(heads_q, n_q)]
    args = dict(q=stand_in(1), k=stand_in(2), v=stand_in(3), o=stand_in(4), lse=0, batch=batch, heads_q=heads_q,
                heads_kv=heads_kv, seqlen_q=n_q, seqlen_kv=n_kv, head_dim=head_dim, strides=strides)
    args.update(kw)
    return _capi.make_params(**args)


def test_library_loads_with_this_modules_struct_layout():
    lib = _capi.lib()
    assert lib.fa_api_version() == _capi.API_VERSION
    assert lib.fa_attention_params_size() == ctypes.sizeof(_capi.Params)


def test_make_params_fills_every_field_it_is_given():
    strides = [[1000 + 10 * t + a for a in range(4)] for t in range(4)]
    p = _capi.make_params(q=stand_in(1), k=stand_in(2), v=stand_in(3), o=stand_in(4), lse=stand_in(5), batch=2,
                          heads_q=6, heads_kv=3, seqlen_q=77, seqlen_kv=131, head_dim=128, strides=strides,
                          softmax_scale=0.125, causal=True, bottom_right=True)
    assert [p.q, p.k, p.v, p.o, p.lse] == [stand_in(i) for i in range(1, 6)]
    assert [p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_kv, p.head_dim] == [2, 6, 3, 77, 131, 128]
    assert [list(row) for row in p.strides] == strides
    assert (p.softmax_scale, p.causal, p.causal_align, p.dtype) == (0.125, 1, _capi.CAUSAL_BOTTOM_RIGHT,
                                                                    _capi.DTYPE_BF16)
    assert (p.workspace, p.workspace_bytes, p.num_splits, p.reserved_flags, p.seqlens_kv) == (None, 0, 0, 0, None)
    assert (p.block_table, p.block_table_stride, p.page_size, p.num_pages) == (None, 0, 0, 0)
    assert p.struct_size == ctypes.sizeof(_capi.Params)
    null = _capi.make_params(q=0, k=0, v=0, o=0, lse=0, batch=1, heads_q=1, heads_kv=1, seqlen_q=1, seqlen_kv=1,
                             head_dim=64, strides=strides)
    assert [null.q, null.lse, null.causal, null.causal_align] == [None, None, 0, _capi.CAUSAL_TOP_LEFT]


def test_fp16_reaches_the_librarys_validation():
    # DTYPE_FP16 is passed through; every lesson refuses it by name with what it takes (bf16), and
    # kernel 100 (pinned to no GPU, so judged here without one) takes it where the library is built
    # with it, else refuses it the same way.
    p = params(dtype=_capi.DTYPE_FP16)
    assert p.dtype == _capi.DTYPE_FP16 == 1
    err = _capi.validate(0, p)
    assert isinstance(err, ValueError) and "element type fp16 is not supported by this step; supported: bf16" in str(err)
    err = _capi.validate(100, p)
    assert err is None or "element type fp16 is not supported by this step; supported: bf16" in str(err), err
    assert _capi.validate(100, params()) is None


def test_a_scale_past_fp32s_range_becomes_inf_and_is_refused():
    # C (and ctypes) turn a double beyond fp32's range into ±inf; the library refuses that scale.
    for big in (1e39, -1e39):
        p = params(softmax_scale=big)
        assert p.softmax_scale == math.copysign(math.inf, big)
        err = _capi.validate(0, p)
        assert isinstance(err, ValueError), err
        assert "scale" in str(err)
    assert params(softmax_scale=3.4e38).softmax_scale == pytest.approx(3.4e38, rel=1e-7)  # in range: kept


def test_steps_are_the_step_folders_in_order_with_lessons():
    folders = sorted(d for d in os.listdir(os.path.join(ROOT, "steps"))
                     if re.fullmatch(r"\d\d_\w+", d) and os.path.exists(os.path.join(ROOT, "steps", d, "step.cmake")))
    listed = _capi.steps()
    assert [s.folder for s in listed if s.number < 100] == folders
    # The production kernels follow, numbered above every step.
    assert [s.folder for s in listed if s.number >= 100] == ["100_kernel_mma", "101_kernel_hopper"]
    for s in listed:
        assert s.lesson.strip(), s
    by_number = {s.number: s for s in listed}
    assert by_number[0].causal and not by_number[1].causal  # the naive step masks; online softmax does not
    assert by_number[7].lse and not by_number[6].lse        # LSE is step 07's lesson


def test_a_well_formed_call_validates():
    assert _capi.validate(0, params()) is None


def test_unknown_step_is_an_invalid_call_naming_it():
    err = _capi.validate(987, params())
    assert isinstance(err, _capi.InvalidCallError) and isinstance(err, ValueError)
    assert "unknown step 987" in str(err)
    with pytest.raises(_capi.InvalidCallError, match="unknown step 987"):
        _capi.forward(987, params(), 0)


def test_unsupported_head_dim_says_what_is_supported():
    err = _capi.validate(0, params(head_dim=96))
    assert isinstance(err, _capi.UnsupportedInputError)
    assert "head dim 96" in str(err) and "supported" in str(err)
    with pytest.raises(_capi.UnsupportedInputError, match="head dim 96"):
        _capi.forward(0, params(head_dim=96), 0)


def test_heads_not_a_multiple_are_refused():
    err = _capi.validate(0, params(heads_q=6, heads_kv=4))
    assert isinstance(err, _capi.UnsupportedInputError), err
    assert "multiple" in str(err)


def test_null_output_is_refused():
    err = _capi.validate(0, params(o=0))
    assert isinstance(err, _capi.UnsupportedInputError), err
    assert "non-null" in str(err)


def test_lse_on_a_step_without_it_is_refused():
    err = _capi.validate(3, params(lse=stand_in(5)))
    assert isinstance(err, _capi.UnsupportedInputError), err
    assert "LSE" in str(err) or "lse" in str(err)


def test_causal_on_a_step_without_it_is_refused():
    err = _capi.validate(1, params(causal=True))
    assert isinstance(err, _capi.UnsupportedInputError), err
    assert "causal" in str(err)


def test_bottom_right_alignment_reaches_the_library():
    p = params(causal=True, bottom_right=True, n_q=100, n_kv=300)
    assert p.causal_align == _capi.CAUSAL_BOTTOM_RIGHT
    assert _capi.validate(5, p) is None


def test_error_classes_by_code():
    assert type(_capi.error_for(_capi.ERROR_INVALID, "x")) is _capi.InvalidCallError
    assert type(_capi.error_for(_capi.ERROR_UNSUPPORTED, "x")) is _capi.UnsupportedInputError
    runtime = _capi.error_for(_capi.ERROR_RUNTIME, "cuda failed")
    assert type(runtime) is _capi.AttentionError and runtime.code == _capi.ERROR_RUNTIME and str(runtime) == "cuda failed"


def test_a_missing_library_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(_capi, "_lib", None)
    monkeypatch.setenv(_capi.ENV_LIBRARY, str(tmp_path / "nowhere.so"))
    with pytest.raises(OSError, match="not found"):
        _capi.lib()


def test_tma_steps_refuse_a_broadcast_input_other_steps_take_it():
    def broadcast_k():
        p = params()
        p.strides[1][0] = 0  # K (tensor 1), batch axis (0): one K for every batch entry
        return p

    for s in _capi.steps():
        err = _capi.validate(s.number, broadcast_k())
        if 12 <= s.number <= 16 or s.number == 101:  # Q, K and V through TMA tensor maps
            assert isinstance(err, _capi.UnsupportedInputError), (s.folder, err)
            assert "zero batch stride" in str(err), (s.folder, err)
        elif s.number >= 4:
            # Accepted; a Hopper step then meets validation's last rule, the GPU check, unless
            # this machine has an H100 or H200.
            assert err is None or (s.number >= 11 and "compute capability 9.0" in str(err)), (s.folder, err)


def test_the_librarys_choice_is_the_fastest_step_that_accepts():
    p = params()
    accepted = [s.number for s in _capi.steps() if _capi.validate(s.number, p) is None]
    assert _capi.choose(p) == max(accepted)
    assert _capi.validate(_capi.STEP_AUTO, p) is None
    assert _capi.describe(_capi.STEP_AUTO, p).startswith(f"step {max(accepted)}: ")
    with pytest.raises(_capi.UnsupportedInputError, match="head dim 80"):  # no build has 80 (all: 96 too)
        _capi.choose(params(head_dim=80))


def backward_params(head_dim=64, workspace_bytes=None, **kw):
    fwd = params(head_dim=head_dim, lse=stand_in(5), **kw)
    contiguous = [list(fwd.strides[0]), list(fwd.strides[0]), list(fwd.strides[1]), list(fwd.strides[1])]
    size = _capi.backward_workspace_size(fwd) if workspace_bytes is None else workspace_bytes
    return _capi.make_backward_params(fwd, d_o=stand_in(6), dq=stand_in(7), dk=stand_in(8), dv=stand_in(9),
                                      strides=contiguous, workspace=stand_in(10), workspace_bytes=size)


def test_forward_workspace_only_for_decode_calls_as_the_package_expects():
    """The package asks for a split workspace only where N_q·H_q/H_kv <= DECODE_MAX_PACKED_ROWS: the
    library must agree on the bound, or a decode call would go without one."""
    g = 4  # query heads per KV head
    n_q = _capi.DECODE_MAX_PACKED_ROWS // g
    assert _capi.forward_workspace_size(params(heads_q=8, heads_kv=2, n_q=n_q, n_kv=1000)) > 0
    assert _capi.forward_workspace_size(params(heads_q=8, heads_kv=2, n_q=n_q + 1, n_kv=1000)) == 0


def test_backward_struct_layout_and_workspace():
    assert _capi.lib().fa_backward_params_size() == ctypes.sizeof(_capi.BackwardParams)
    rows = 2 * 4 * 128
    # dQ in fp32, D, the deterministic mode's turnstiles (one int32 per 16 rows: 256 bytes), the LSE in exp2 units
    assert _capi.backward_workspace_size(params()) == rows * 64 * 4 + rows * 4 + 256 + rows * 4
    with pytest.raises(_capi.InvalidCallError):
        _capi.backward_workspace_size(params(n_q=0))


def test_which_steps_have_a_backward():
    have = [s.number for s in _capi.steps() if _capi.has_backward(s.number)]
    assert 17 in have and 10 not in have and 100 in have and 101 in have
    with pytest.raises(_capi.InvalidCallError):
        _capi.has_backward(999)


def test_backward_refusals_say_why_and_launch_nothing():
    with pytest.raises(_capi.UnsupportedInputError, match="step 10 has no backward"):
        _capi.backward(10, backward_params(), 0)
    b = backward_params()
    b.fwd.lse = None
    with pytest.raises(_capi.UnsupportedInputError, match="needs the forward's LSE"):
        _capi.backward(17, b, 0)
    small = _capi.backward_workspace_size(params()) - 1
    with pytest.raises(_capi.UnsupportedInputError, match="needs a workspace of"):
        _capi.backward(_capi.STEP_AUTO, backward_params(workspace_bytes=small), 0)
    with pytest.raises(_capi.UnsupportedInputError, match="head dim 80"):
        _capi.backward(_capi.STEP_AUTO, backward_params(head_dim=80), 0)
    b = backward_params()
    b.reserved[0] = 1
    with pytest.raises(_capi.InvalidCallError, match="reserved"):
        _capi.backward(17, b, 0)
    b = backward_params()
    b.deterministic = 1
    with pytest.raises(_capi.UnsupportedInputError, match="no deterministic mode"):
        _capi.backward(17, b, 0)
    b.deterministic = 3
    with pytest.raises(_capi.InvalidCallError, match="deterministic is 3"):
        _capi.backward(17, b, 0)

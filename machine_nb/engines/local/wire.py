"""The two protobuf messages of Tinker's HTTP API, as the local server reads and writes them.

The tinker SDK sends `forward_backward` requests as `tinker_public_pb2.ForwardBackwardRequest`
and accepts forward/backward and sampling results only as protobuf (`ForwardBackwardOutput`,
`SampleResponse`); everything else is JSON. This module is the inverse of the SDK's own
`tinker.proto.request_conv` (requests) and `response_conv` (responses), using the message
definitions that ship inside the SDK. Errors name the field, for the server's 400 answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

CONTENT_TYPE = "application/x-protobuf"

_NP_DTYPES = {pb.DTYPE_FLOAT32: np.dtype(np.float32), pb.DTYPE_INT64: np.dtype(np.int64),
              pb.DTYPE_INT32: np.dtype(np.int32)}


class WireError(ValueError):
    """A request body that does not decode; `field` names where (e.g. "data.3.loss_fn_inputs.weights").
    `model_id` and `seq_id` are the request's when it names them (its data is what failed), so the
    server can give the refused request's place in its run's order to the next one."""

    def __init__(self, message: str, field: str | None = None, *, model_id: str | None = None,
                 seq_id: int | None = None):
        super().__init__(message)
        self.field, self.model_id, self.seq_id = field, model_id, seq_id


@dataclass
class Datum:
    """One decoded datum: its input token ids and its loss inputs as flat numpy arrays."""

    ids: list[int]
    loss_fn_inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class ForwardBackwardRequest:
    model_id: str
    seq_id: int | None
    loss_fn: str
    forward_only: bool
    loss_fn_config: dict[str, Any]
    data: list[Datum]


def _tensor(msg: Any, where: str) -> np.ndarray:
    dtype = _NP_DTYPES.get(msg.dtype)
    if dtype is None:
        raise WireError(f"unsupported tensor dtype {msg.dtype} (float32 or int64)", where)
    if msg.HasField("sparse_csr"):
        raise WireError("sparse tensors are not supported by the local engine", where)
    data = msg.dense
    if len(data) % dtype.itemsize:
        raise WireError(f"{len(data)} bytes are not a whole number of {dtype.name} values", where)
    arr = np.frombuffer(data, dtype=dtype).copy()
    shape = list(msg.shape)
    if shape and int(np.prod(shape)) != arr.size:
        raise WireError(f"shape {shape} does not hold {arr.size} values", where)
    return arr


def decode_forward_backward(body: bytes) -> ForwardBackwardRequest:
    """A `ForwardBackwardRequest` protobuf body, decoded; WireError naming the field if malformed."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # google.protobuf.message.DecodeError and friends
        raise WireError(f"not a ForwardBackwardRequest protobuf ({type(exc).__name__}: {exc})") from None
    if not msg.model_id:
        raise WireError("missing", "model_id")
    seq_id = int(msg.seq_id) if msg.seq_id else None
    try:
        return _decode_fields(msg, seq_id)
    except WireError as exc:
        exc.model_id, exc.seq_id = msg.model_id, seq_id
        raise


def _decode_fields(msg: Any, seq_id: int | None) -> ForwardBackwardRequest:
    """The decoded request of a parsed message whose model id is there; WireError naming the field."""
    config: dict[str, Any] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        config[k] = v.text if v.WhichOneof("value") == "text" else float(v.number)
    data = []
    for i, d in enumerate(msg.data):
        ids: list[int] = []
        for j, chunk in enumerate(d.model_input):
            kind = chunk.WhichOneof("chunk")
            if kind != "encoded_text":
                raise WireError(f"{kind or 'empty'} chunks are not supported by the local engine (text only)",
                                f"data.{i}.model_input.{j}")
            raw = chunk.encoded_text.tokens
            if len(raw) % 4:
                raise WireError("token bytes are not whole int32 values", f"data.{i}.model_input.{j}.tokens")
            ids.extend(int(t) for t in np.frombuffer(raw, dtype=np.int32))
        inputs = {name: _tensor(t, f"data.{i}.loss_fn_inputs.{name}") for name, t in d.loss_fn_inputs.items()}
        data.append(Datum(ids, inputs))
    return ForwardBackwardRequest(model_id=msg.model_id, seq_id=seq_id,
                                  loss_fn=msg.loss_fn or "cross_entropy", forward_only=bool(msg.forward_only),
                                  loss_fn_config=config, data=data)


def _batched(arrays: Sequence[np.ndarray], dtype: Any, proto_dtype: int) -> Any:
    parts = [np.ascontiguousarray(a, dtype=dtype).reshape(-1) for a in arrays]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([p.nbytes for p in parts])
    return pb.BatchedTensor(data=b"".join(p.tobytes() for p in parts), offsets=offsets.tobytes(), dtype=proto_dtype)


def encode_forward_backward_output(outputs: Sequence[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """`ForwardBackwardOutput` protobuf bytes: one ArrayRecord with a float32 field per output name."""
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(outputs))
    names = list(outputs[0]) if outputs else []
    for name in names:
        record.fields[name].CopyFrom(_batched([o[name] for o in outputs], np.float32, pb.DTYPE_FLOAT32))
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics={k: float(v) for k, v in metrics.items()})
    msg.loss_fn_outputs.append(record)
    return msg.SerializeToString()


_STOP = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}


def encode_sample_response(sequences: Sequence[Any], prompt_logprobs: Sequence[float | None] | None = None) -> bytes:
    """`SampleResponse` protobuf bytes from compute.Sample-like objects (tokens, logprobs, stop_reason).

    Prompt log-probabilities travel as float32 with NaN where there is none (the first token).
    """
    msg = pb.SampleResponse()
    for s in sequences:
        msg.sequences.append(pb.SampledSequence(
            stop_reason=_STOP[s.stop_reason], tokens=np.asarray(s.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(s.logprobs, dtype=np.float32).tobytes()))
    if prompt_logprobs is not None:
        values = np.asarray([np.nan if v is None else v for v in prompt_logprobs], dtype=np.float32)
        msg.prompt_logprobs = values.tobytes()
    return msg.SerializeToString()

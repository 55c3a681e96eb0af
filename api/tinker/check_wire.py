#!/usr/bin/env python3
# Checks api/tinker/tinker_wire.proto against the pinned tinker SDK: a ForwardBackwardRequest the
# SDK serializes parses with our messages field for field, and the ForwardBackwardOutput and
# SampleResponse we would encode parse with the SDK's own deserializers.
#
#   pip install tinker==0.38.0
#   protoc -Iapi/tinker --descriptor_set_out=/tmp/wire.desc api/tinker/tinker_wire.proto
#   python3 api/tinker/check_wire.py /tmp/wire.desc
import sys, numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
import tinker
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

fds = descriptor_pb2.FileDescriptorSet()
fds.ParseFromString(open(sys.argv[1], 'rb').read())
pool = descriptor_pool.DescriptorPool()
for f in fds.file: pool.Add(f)
def cls(name): return message_factory.GetMessageClass(pool.FindMessageTypeByName('loradb.tinker.wire.' + name))
Req, Out, Samp = cls('ForwardBackwardRequest'), cls('ForwardBackwardOutput'), cls('SampleResponse')

datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                    loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [0.0, 1.0, 1.0]})
req = types.ForwardBackwardRequest(
    forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="ppo",
                                                      loss_fn_config={"clip_low_threshold": 0.9}),
    model_id="s1:train:0", seq_id=7)
wire = forward_backward_request_to_proto(req).SerializeToString()
ours = Req(); ours.ParseFromString(wire)
assert ours.model_id == "s1:train:0" and ours.seq_id == 7 and ours.loss_fn == "ppo"
assert ours.loss_fn_config_v2["clip_low_threshold"].number == 0.9
assert list(np.frombuffer(ours.data[0].model_input[0].encoded_text.tokens, np.int32)) == [1, 2, 3]
t = ours.data[0].loss_fn_inputs["target_tokens"]
assert t.dtype == 2 and list(t.shape) == [3] and list(np.frombuffer(t.dense, np.int64)) == [2, 3, 4]
w = ours.data[0].loss_fn_inputs["weights"]
assert w.dtype == 1 and list(np.frombuffer(w.dense, np.float32)) == [0.0, 1.0, 1.0]

out = Out(); out.loss_fn_output_type = "ArrayRecord"; out.metrics["loss:sum"] = 1.5
rec = out.loss_fn_outputs.add(); rec.num_datums = 2
lp = [np.array([-1.0, -2.0], np.float32), np.array([-3.0], np.float32)]
bt = rec.fields["logprobs"]; bt.dtype = 1
bt.data = b"".join(a.tobytes() for a in lp)
bt.offsets = np.array([0, 8, 12], np.int64).tobytes()
sdk = deserialize_forward_backward_output(out.SerializeToString())
assert sdk.metrics == {"loss:sum": 1.5} and len(sdk.loss_fn_outputs) == 2
assert sdk.loss_fn_outputs[1]["logprobs"].data == [-3.0] and sdk.loss_fn_outputs[0]["logprobs"].shape == [2]

s = Samp(); seq = s.sequences.add(); seq.stop_reason = 1
seq.tokens = np.array([5, 6], np.int32).tobytes(); seq.logprobs = np.array([-0.5, -0.25], np.float32).tobytes()
r = deserialize_sample_response(s.SerializeToString())
assert r.sequences[0].tokens == [5, 6] and r.sequences[0].stop_reason == "length"
print("wire format matches tinker", tinker.__version__)

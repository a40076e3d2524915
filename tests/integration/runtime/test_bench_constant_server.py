"""The client-ceiling benchmark's stand-in server, as the Python clients use it.

``bench.client_ceiling`` takes what a client reaches against ``bench.constant_server`` as the
most any server could show through that client. That holds only if the clients get from it
what they get from the runtime: a whole, parseable answer per call over keep-alive HTTP/1.1
(JSON tensors) and over gRPC, the same bytes each time.
"""

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from bench import servers
from bench.constant_server import constant_response

pytestmark = pytest.mark.integration


def test_the_python_clients_get_the_stored_answer_over_both_protocols(tmp_path: Path) -> None:
    expected = constant_response("mlp").outputs[0].data
    x = np.ones((1, 512), np.float32)
    with servers.constant("mlp", 0, tmp_path / "constant.log") as server:
        http = triton_http.InferenceServerClient(f"{servers.HOST}:{server.http_port}")
        tensor = triton_http.InferInput("INPUT__0", [1, 512], "FP32")
        tensor.set_data_from_numpy(x, binary_data=False)
        wanted = [triton_http.InferRequestedOutput("OUTPUT__0", binary_data=False)]
        for _ in range(3):  # one keep-alive connection, several calls
            answer = http.infer("mlp", [tensor], outputs=wanted)
            np.testing.assert_array_equal(answer.as_numpy("OUTPUT__0"), expected)
        http.close()

        grpc = triton_grpc.InferenceServerClient(f"{servers.HOST}:{server.grpc_port}")
        grpc_tensor = triton_grpc.InferInput("INPUT__0", [1, 512], "FP32")
        grpc_tensor.set_data_from_numpy(x)
        for _ in range(3):
            answer = grpc.infer("mlp", [grpc_tensor], client_timeout=10)
            np.testing.assert_array_equal(answer.as_numpy("OUTPUT__0"), expected)
        grpc.close()
        assert server.process.poll() is None

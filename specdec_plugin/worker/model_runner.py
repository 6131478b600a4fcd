"""The model runner: vLLM's V1 ``GPUModelRunner`` with device work routed to the device layer.

Speculative decoding plugs in here: the runner swaps vLLM's rejection sampler and proposers
for ours (``specdec_plugin.spec_decode``) once it is constructed.
"""
from __future__ import annotations

import torch
from vllm.config import VllmConfig
from vllm.platforms import current_platform
from vllm.v1.worker.gpu_model_runner import GPUModelRunner


class SpecDecModelRunner(GPUModelRunner):
    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        super().__init__(vllm_config, device)
        self.device_layer = current_platform.device

    def _sync_device(self) -> None:
        self.device_layer.synchronize()

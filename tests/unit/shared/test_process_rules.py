"""Process classification: real-world command lines, the memory/utilisation rules, hostile input, bad configs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.contract.models_workload import ProcessClass
from shared.gpu.process_rules import DEFAULT, ProcessFacts, ProcessRules
from shared.plumbing.errors import ConfigError

RULES = ProcessRules.load()
T, INF, L, G, C = (
    ProcessClass.TRAINING,
    ProcessClass.INFERENCE,
    ProcessClass.LLM_SERVING,
    ProcessClass.GAMING,
    ProcessClass.COMPUTE,
)

# (executable, command line, expected class, expected rule), as ps/nvidia-smi show them.
REAL_WORLD = [
    ("/usr/local/bin/ollama", "/usr/local/bin/ollama serve", L, "ollama"),
    (
        "/usr/lib/ollama/runners/cuda_v12/ollama_llama_server",
        "/usr/lib/ollama/runners/cuda_v12/ollama_llama_server --model /root/.ollama/models/blobs/sha256-6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa --ctx-size 8192 --batch-size 512 --n-gpu-layers 33 --threads 8 --parallel 4 --port 39461",
        L,
        "ollama",
    ),
    (
        "/usr/bin/ollama",
        "/usr/bin/ollama runner --model /root/.ollama/models/blobs/sha256-74701a8c35f6 --ctx-size 4096 --port 40123",
        L,
        "ollama",
    ),
    ("C:\\Users\\ana\\AppData\\Local\\Programs\\Ollama\\ollama.exe", "ollama.exe serve", L, "ollama"),
    (
        "/usr/bin/python3.12",
        "python3 -m vllm.entrypoints.openai.api_server --model meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 2 --gpu-memory-utilization 0.9",
        L,
        "vllm",
    ),
    (
        "/usr/bin/python3.12",
        "/usr/bin/python3 /usr/local/bin/vllm serve Qwen/Qwen2.5-7B-Instruct --max-model-len 32768",
        L,
        "vllm",
    ),
    (
        "/usr/bin/python3.12",
        "VLLM::EngineCore python -c from vllm.v1.engine.core import run_engine_core",
        L,
        "vllm",
    ),
    (
        "/usr/local/bin/text-generation-launcher",
        "text-generation-launcher --model-id mistralai/Mistral-7B-Instruct-v0.3 --port 8080",
        L,
        "text-generation-inference",
    ),
    (
        "/opt/conda/bin/python3.11",
        "/opt/conda/bin/python3.11 /opt/conda/bin/text-generation-server serve mistralai/Mistral-7B-Instruct-v0.3 --uds-path /tmp/text-generation-server-0",
        L,
        "text-generation-inference",
    ),
    (
        "/usr/bin/python3",
        "python3 -m sglang.launch_server --model-path meta-llama/Meta-Llama-3-8B-Instruct --port 30000",
        L,
        "sglang",
    ),
    (
        "/app/llama-server",
        "./llama-server -m models/llama-2-7b.Q4_K_M.gguf -c 2048 -ngl 99 --host 0.0.0.0",
        L,
        "llama-cpp-server",
    ),
    (
        "/usr/bin/python3",
        "python3 -m llama_cpp.server --model ./mistral.gguf --n_gpu_layers -1",
        L,
        "llama-cpp-server",
    ),
    (
        "/opt/tritonserver/bin/tritonserver",
        "tritonserver --model-repository=/models --http-port=8000",
        INF,
        "triton-server",
    ),
    (
        "/usr/bin/java",
        "java -Dmodel_server_home=/home/venv/lib/python3.9/site-packages -cp .:/home/venv/lib/python3.9/site-packages/ts/frontend/* org.pytorch.serve.ModelServer torchserve --start",
        INF,
        "inference-servers",
    ),
    (
        "/usr/src/tensorrt/bin/trtexec",
        "trtexec --onnx=resnet50.onnx --fp16 --saveEngine=r50.plan",
        INF,
        "inference-servers",
    ),
    (
        "/usr/bin/python3",
        "/usr/bin/python3 /usr/local/bin/torchrun --nnodes=2 --nproc_per_node=8 --rdzv_endpoint=10.0.0.1:29500 pretrain_gpt.py --tensor-model-parallel-size 4",
        T,
        "distributed-launcher",
    ),
    (
        "/usr/bin/python3",
        "python -m torch.distributed.run --nproc_per_node=4 main.py --epochs 90",
        T,
        "distributed-launcher",
    ),
    (
        "/usr/bin/python3",
        "/usr/bin/python3 -u main.py --local-rank=3 --epochs 90 --batch-size 256",
        T,
        "distributed-worker",
    ),
    (
        "/usr/bin/python3",
        "/usr/bin/python /usr/local/bin/deepspeed --num_gpus 8 finetune.py --deepspeed ds_config_zero3.json",
        T,
        "distributed-launcher",
    ),
    (
        "/usr/bin/python3",
        "python3 main.py --deepspeed --deepspeed_config ds_config.json",
        T,
        "distributed-worker",
    ),
    (
        "/usr/bin/python3",
        "/usr/bin/python3 /usr/local/bin/accelerate launch --multi_gpu --num_processes 8 train_lora.py",
        T,
        "distributed-launcher",
    ),
    (
        "/usr/bin/python3",
        "python -m accelerate.commands.launch --config_file fsdp.yaml run.py",
        T,
        "distributed-launcher",
    ),
    (
        "/usr/bin/python3.10",
        "python run_clm.py --model_name_or_path gpt2 --dataset_name wikitext --do_train",
        T,
        "training-script",
    ),
    (
        "/usr/bin/python3.10",
        "python3 examples/pytorch/train_imagenet.py --arch resnet50",
        T,
        "training-script",
    ),
    ("/usr/bin/python3.10", "python scripts/llama_finetune_v2.py --lr 2e-5", T, "training-script"),
    ("/usr/bin/python3.10", "python3 bench/gpu_workloads/train_loop.py 150", T, "training-script"),
    ("/usr/bin/python3.10", "python3 bench/gpu_workloads/infer_loop.py 150", INF, "inference-script"),
    (
        "/usr/bin/python3.10",
        "python predict.py --checkpoint best.ckpt --input images/",
        INF,
        "inference-script",
    ),
    ("/usr/bin/python3.10", "python3 batch_inference.py --model resnet50", INF, "inference-script"),
    (
        "/home/ana/.local/share/Steam/steamapps/common/Proton 9.0 (Beta)/files/bin/wine64-preloader",
        "/home/ana/.local/share/Steam/steamapps/common/Proton 9.0 (Beta)/files/bin/wine64 c:\\windows\\system32\\steam.exe Z:\\home\\ana\\.local\\share\\Steam\\steamapps\\common\\Cyberpunk 2077\\bin\\x64\\Cyberpunk2077.exe",
        G,
        "steam-proton",
    ),
    ("/usr/games/gamescope", "gamescope -W 2560 -H 1440 -f -- %command%", G, "steam-proton"),
    (
        "C:\\Program Files (x86)\\Steam\\steamapps\\common\\ELDEN RING\\Game\\eldenring.exe",
        None,
        G,
        "steam-proton",
    ),
    (
        "C:\\Games\\Baldurs Gate 3\\bin\\bg3_dx11.exe",
        '"C:\\Games\\Baldurs Gate 3\\bin\\bg3_dx11.exe" --skip-launcher',
        G,
        "windows-game-exe",
    ),
    ("/home/ana/games/Hollow_Knight/hollow_knight.x86_64", "./hollow_knight.x86_64", G, "game-engines"),
    (
        "/usr/lib/xorg/Xorg",
        "/usr/lib/xorg/Xorg vt2 -displayfd 3 -auth /run/user/1000/gdm/Xauthority",
        C,
        "desktop-graphics",
    ),
    ("/usr/bin/gnome-shell", "/usr/bin/gnome-shell", C, "desktop-graphics"),
    (
        "/usr/bin/python3",
        "python -m ipykernel_launcher -f /root/.local/share/jupyter/runtime/kernel-1.json",
        C,
        "default",
    ),
    ("/usr/local/cuda/extras/demo_suite/bandwidthTest", "./bandwidthTest --memory=pinned", C, "default"),
    (None, None, C, "default"),
]


@pytest.mark.parametrize(("exe", "cmd", "cls", "rule"), REAL_WORLD)
def test_real_world_command_lines(exe: str | None, cmd: str | None, cls: ProcessClass, rule: str) -> None:
    verdict = RULES.classify(ProcessFacts(executable=exe, command_line=cmd))
    assert (verdict.process_class, verdict.rule) == (cls, rule)


@pytest.mark.parametrize(
    ("facts", "cls", "rule"),
    [
        # the real H100's anonymous workers (bench/gpu_processes.sh): only their numbers say what they are
        (
            ProcessFacts("/usr/bin/python3.12", "python3 worker.py burn 10 150", "compute", 11332, 84.0),
            T,
            "python-saturating-large",
        ),
        (
            ProcessFacts("/usr/bin/python3.12", "python3 worker.py hold 6 150", "compute", 6982, 0.0),
            INF,
            "python-resident-idle",
        ),
        (ProcessFacts("/usr/bin/python3.12", "python3 worker.py", "compute", 6982, None), C, "default"),
        (ProcessFacts("/usr/bin/python3.12", "python3 worker.py", "compute", 2048, 95.0), C, "default"),
        (ProcessFacts("/opt/app/renderer", None, "graphics", 900, 55.0), G, "graphics-context"),
        (ProcessFacts("/opt/app/renderer", None, "compute", 900, 55.0), C, "default"),
    ],
)
def test_memory_and_utilisation_patterns(facts: ProcessFacts, cls: ProcessClass, rule: str) -> None:
    assert RULES.classify(facts) == type(DEFAULT)(cls, rule)


def test_first_matching_rule_wins() -> None:
    # a launched worker of a script named for inference is still a training worker
    verdict = RULES.classify(ProcessFacts("/usr/bin/python3", "python evaluate.py --local_rank=0"))
    assert verdict.rule == "distributed-worker"


text = st.text(st.characters(codec="utf-8"), max_size=6000)


@settings(max_examples=300, deadline=None)
@given(
    exe=st.none() | text,
    cmd=st.none() | text,
    kind=st.sampled_from(["compute", "graphics", "compute+graphics"]),
    memory=st.none() | st.integers(0, 10**8),
    util=st.none() | st.floats(0, 100),
)
def test_any_process_gets_a_class_and_a_named_rule(
    exe: str | None, cmd: str | None, kind: str, memory: int | None, util: float | None
) -> None:
    verdict = RULES.classify(ProcessFacts(exe, cmd, kind, memory, util))
    assert verdict.process_class in ProcessClass
    assert verdict.rule in {r.name for r in RULES.rules} | {"default"}


@settings(max_examples=100, deadline=None)
@given(junk=st.text(max_size=300))
def test_noise_around_a_real_command_line_keeps_its_class(junk: str) -> None:
    cmd = f"/usr/local/bin/ollama serve {junk}"
    assert RULES.classify(ProcessFacts("/usr/local/bin/ollama", cmd)).rule == "ollama"


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("", "at least one"),
        ("[[rule]]\nname='a'\nclass='training'\ncommand=['(']", "bad command pattern"),
        ("[[rule]]\nname='a'\nclass='mining'\ncommand=['x']", "class must be one of"),
        ("[[rule]]\nname='a'\nclass='training'", "no condition"),
        (
            "[[rule]]\nname='a'\nclass='training'\ncommand=['x']\n[[rule]]\nname='a'\nclass='gaming'\ncommand=['y']",
            "unique",
        ),
        ("[[rule]]\nname='a'\nclass='training'\ncmd=['x']", "unknown keys"),
        ("[[rule]]\nname='A b'\nclass='training'\ncommand=['x']", "identifier"),
        ("[[rule]]\nname='a'\nclass='training'\nmin_memory_mib=-1", "non-negative"),
        ("[[rule]]\nname='a'\nclass='training'\ntype='vulkan'", "type must be"),
        ("[[rule]]\nname='a'\nclass='training'\ncommand='x'", "list of strings"),
        ("[[rule]\n", "not valid TOML"),
    ],
)
def test_bad_rule_files_are_refused_with_the_reason(toml: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ProcessRules.from_toml(toml)


def test_the_reviewed_file_covers_every_class() -> None:
    assert {r.process_class for r in RULES.rules} == set(ProcessClass)

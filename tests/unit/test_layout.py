"""House rules that a linter cannot say: each service is `python -m services.<name>` with a
`main() -> int` that is one `run_service(...)`, its settings in `settings.py` and its object graph in
`build.py`; services import `shared`, never each other; the users' library (gpuhealth) imports
no `services` or `shared` module, only what its own distribution installs; no module imports itself
back through others or another's private names; a test module imports helpers, never another test
module; and no C or C++ source is in the tree."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from scripts.requirements import requirements
from tests.helpers.imports import imported_modules, imports_of, project_modules
from tests.paths import REPO

SERVICES = sorted(p.name for p in (REPO / "services").iterdir() if (p / "__init__.py").exists())


@pytest.mark.parametrize("service", SERVICES)
def test_services_never_import_each_other(service: str) -> None:
    for path in (REPO / "services" / service).rglob("*.py"):
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] == "services" and len(parts) > 1:
                assert parts[1] == service, f"{path.relative_to(REPO)} imports {module}"


def test_shared_imports_no_service() -> None:
    for path in (REPO / "shared").rglob("*.py"):
        assert not [m for m in imported_modules(path) if m.split(".")[0] == "services"], path


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_has_a_main_returning_int(service: str) -> None:
    module = importlib.import_module(f"services.{service}.__main__")
    assert inspect.signature(module.main).return_annotation in ("int", int)


# ---------------------------------------------------------------- one shape for every service (#43 item 4)

# The verifier is a command run once (identity, compute, audit, ...): its exit status is the answer, not
# how a service stopped, and most of its commands run with no settings at all; it has the settings and the
# builder of the others, not their run.
COMMANDS = {"verifier"}
# What only shared.plumbing.running.run_service does: a `__main__` that calls one of these repeats it.
SKELETON = {"start_service", "ServiceRun", "serve_metrics", "load_settings", "setup_logging"}


def _calls(node: ast.AST) -> set[str]:
    """The names every call under `node` calls (`f(...)` and `x.f(...)` both give `f`)."""
    called = set()
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            func = call.func
            called.add(func.id if isinstance(func, ast.Name) else getattr(func, "attr", ""))
    return called


def _main(service: str) -> ast.FunctionDef:
    tree = ast.parse((REPO / "services" / service / "__main__.py").read_text())
    mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    assert len(mains) == 1, f"services/{service}/__main__.py has no main()"
    return mains[0]


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_has_its_settings_and_its_builder(service: str) -> None:
    for name in ("settings.py", "build.py", "__main__.py"):
        assert (REPO / "services" / service / name).is_file(), f"services/{service}/{name} is missing"


@pytest.mark.parametrize("service", sorted(set(SERVICES) - COMMANDS))
def test_each_service_main_is_one_run_service(service: str) -> None:
    main = _main(service)
    assert [type(n) for n in main.body] == [ast.Return], f"services.{service}.__main__.main is not one return"
    ret = main.body[0]
    assert isinstance(ret, ast.Return)
    assert isinstance(ret.value, ast.Call)
    assert isinstance(ret.value.func, ast.Name)
    assert ret.value.func.id == "run_service", f"services.{service}.__main__.main returns no run_service(...)"


@pytest.mark.parametrize("service", SERVICES)
def test_no_main_repeats_the_service_skeleton(service: str) -> None:
    tree = ast.parse((REPO / "services" / service / "__main__.py").read_text())
    repeated = _calls(tree) & SKELETON
    assert not repeated, f"services/{service}/__main__.py calls {sorted(repeated)}: run_service does that"
    imported = {alias.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for alias in n.names}
    assert not imported & SKELETON, f"services/{service}/__main__.py imports {sorted(imported & SKELETON)}"


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_settings_module_holds_its_settings_tree(service: str) -> None:
    """Its Settings subclass lives in settings.py, nowhere else in the service."""
    from shared.settings.common import Settings

    module = importlib.import_module(f"services.{service}.settings")
    trees = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, Settings)]
    assert [t for t in trees if t.__module__ == module.__name__], (
        f"services/{service}/settings.py has no tree"
    )
    for path in (REPO / "services" / service).rglob("*.py"):
        if path.name == "settings.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
                assert "Settings" not in bases, (
                    f"{path.relative_to(REPO)} defines {node.name}: settings.py holds it"
                )


# The import names of the library's dependencies (gpuhealth/pyproject.toml, its extras included),
# and the frameworks that only the callback module of each imports.
LIBRARY_DISTRIBUTIONS = {
    "pydantic": "pydantic", "pydantic-settings": "pydantic_settings",
    "prometheus-client": "prometheus_client", "nvidia-ml-py": "pynvml", "confluent-kafka": "confluent_kafka",
}  # fmt: skip
FRAMEWORKS = {
    "gpuhealth/training/lightning.py": {"lightning", "pytorch_lightning"},
    "gpuhealth/training/keras.py": {"keras", "tensorflow"},
    "gpuhealth/training/transformers.py": {"transformers"},
}

# What the services and shared may use of the library: its pieces that both need, never the training Andon.
LIBRARY_COMMON = (
    "gpuhealth.andon_rules", "gpuhealth.contract", "gpuhealth.errors", "gpuhealth.gpu", "gpuhealth.kafka",
    "gpuhealth.kafka_settings",
)  # fmt: skip


def library_requirements() -> set[str]:
    """The distribution names gpuhealth/pyproject.toml asks for, extras included."""
    project = tomllib.loads((REPO / "gpuhealth" / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [
        r for extra in project["optional-dependencies"].values() for r in extra
    ]
    return {r.split(";")[0].split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip() for r in wanted}


def test_the_library_imports_only_itself_the_standard_library_and_what_it_declares() -> None:
    assert library_requirements() == set(LIBRARY_DISTRIBUTIONS), "name the import of each new dependency"
    declared = set(LIBRARY_DISTRIBUTIONS.values())
    for path in sorted((REPO / "gpuhealth").rglob("*.py")):
        allowed = {
            "gpuhealth",
            *sys.stdlib_module_names,
            *declared,
            *FRAMEWORKS.get(str(path.relative_to(REPO)), ()),
        }
        used = {m.split(".")[0] for m in imported_modules(path)}
        assert used <= allowed, f"{path.relative_to(REPO)} imports {sorted(used - allowed)}"


def test_the_library_wheel_lists_every_package_of_the_library() -> None:
    """gpuhealth/pyproject.toml names its packages (its folder is the package): a new one must be named."""
    setuptools = tomllib.loads((REPO / "gpuhealth" / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {
        ".".join(("gpuhealth", *p.parent.relative_to(REPO / "gpuhealth").parts))
        for p in (REPO / "gpuhealth").rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == found


def test_services_and_shared_use_only_the_librarys_common_pieces() -> None:
    for path in sorted((REPO / "services").rglob("*.py")) + sorted((REPO / "shared").rglob("*.py")):
        used = [m for m in imported_modules(path) if m.split(".")[0] == "gpuhealth"]
        wrong = [m for m in used if not any(m == c or m.startswith(c + ".") for c in LIBRARY_COMMON)]
        assert not wrong, f"{path.relative_to(REPO)} imports {wrong}"


@pytest.mark.parametrize(
    "path",
    sorted((REPO / "services").rglob("*.py"))
    + sorted((REPO / "shared").rglob("*.py"))
    + sorted((REPO / "gpuhealth").rglob("*.py")),
)
def test_modules_have_a_docstring_and_stay_readable(path: Path) -> None:
    text = path.read_text()
    if path.name != "__init__.py" or text.strip():
        assert ast.get_docstring(ast.parse(text)), f"{path.relative_to(REPO)} has no docstring"
    assert len(text.splitlines()) <= 450, f"{path.relative_to(REPO)} is too long to read in one sitting"


def test_nothing_outside_tests_imports_the_tests() -> None:
    for top in ("services", "shared", "gpuhealth", "evaluation", "bench"):
        for path in sorted((REPO / top).rglob("*.py")):
            assert not [m for m in imported_modules(path) if m.split(".")[0] == "tests"], path


def test_the_fakes_stay_out_of_the_services_and_the_library() -> None:
    for top in ("services", "gpuhealth"):
        for path in sorted((REPO / top).rglob("*.py")):
            used = [m for m in imported_modules(path) if m.startswith("shared.fakes")]
            assert not used, f"{path.relative_to(REPO)} imports {used}"
    for path in sorted((REPO / "shared").rglob("*.py")):
        if "fakes" not in path.relative_to(REPO / "shared").parts:
            assert not [m for m in imported_modules(path) if m.startswith("shared.fakes")], path


def test_the_tests_mirror_the_package_tree() -> None:
    """A test module sits under tests/unit or tests/integration at the path of what it tests."""
    roots = {"services", "shared", "gpuhealth", "evaluation", "bench", "deploy", "schema", "bin", "scripts"}
    for kind in ("unit", "integration"):
        for path in sorted((REPO / "tests" / kind).rglob("test_*.py")):
            parts = path.relative_to(REPO / "tests" / kind).parts
            if len(parts) == 1:  # repository-wide checks (the layout, the README) sit at the top
                continue
            assert parts[0] in roots, f"{path.relative_to(REPO)}: not under a mirrored folder"
            assert (REPO / Path(*parts[:-1])).is_dir(), (
                f"{path.relative_to(REPO)}: {Path(*parts[:-1])} is not in the tree"
            )


C_SOURCES = {".c", ".h", ".cc", ".cpp", ".cxx", ".hh", ".hpp"}


def test_no_c_or_cpp_source_is_in_the_tree() -> None:
    """Every line of the project is memory-safe code: a compiled piece, should one ever earn its
    place, is written in a memory-safe language and built by the package build."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    tracked = [Path(name) for name in listed.decode().split("\0") if name]
    assert tracked, "git ls-files listed nothing"
    assert [str(p) for p in tracked if p.suffix.lower() in C_SOURCES] == []


def test_no_module_imports_itself_back_through_others() -> None:
    """An import circle among the project's modules, lazy imports included (those under
    TYPE_CHECKING never run), fails with the circle it found."""
    modules = project_modules()
    graph = {name: sorted(set(imports_of(path, modules)) - {name}) for name, path in modules.items()}
    circles = []
    done: set[str] = set()
    for start in sorted(graph):  # depth-first, each module left once all it reaches is known
        trail: list[str] = []
        stack = [(start, iter(graph[start]))]
        trail.append(start)
        while stack:
            node, edges = stack[-1]
            following = next((m for m in edges if m not in done), None)
            if following is None:
                stack.pop()
                trail.pop()
                done.add(node)
            elif following in trail:
                circles.append(" -> ".join([*trail[trail.index(following) :], following]))
            else:
                trail.append(following)
                stack.append((following, iter(graph[following])))
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_no_module_imports_another_modules_private_names() -> None:
    """What a module keeps private (a leading `_`) stays in it: a name two modules share is public."""
    modules = project_modules()
    for name, path in sorted(modules.items()):
        if name.startswith("tests."):
            continue  # a test may reach into what it tests
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "") in modules):
                private = [a.name for a in node.names if a.name[:1] == "_" and a.name[:2] != "__"]
                assert not private, f"{path.relative_to(REPO)} imports {private} from {node.module}"


def test_a_test_module_imports_helpers_never_another_test_module() -> None:
    modules = project_modules()
    for kind in ("unit", "integration"):
        for path in sorted((REPO / "tests" / kind).rglob("*.py")):
            tests_used = [m for m in imports_of(path, modules) if m.startswith("tests.")]
            wrong = [m for m in tests_used if m.split(".")[1] not in ("helpers", "paths")]
            assert not wrong, (
                f"{path.relative_to(REPO)} imports {wrong}: move what they share to tests/helpers/"
            )


def test_unit_tests_install_nothing() -> None:
    """No unit test runs an installer (apt-get, pip, the install scripts): `make test-unit` installs
    the tools first, and a test that misses one fails naming the step."""
    installers = ("apt-get", "apt", "pip", "install-tools.sh", "install-docker.sh", "dpkg")
    for path in sorted((REPO / "tests" / "unit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and "subprocess" in ast.unparse(node.func):
                words = [
                    c.value
                    for c in ast.walk(node)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                ]
                ran = [w for w in words if any(w == i or w.endswith("/" + i) for i in installers)]
                assert not ran, f"{path.relative_to(REPO)} runs {ran}"


# shared/ by concern: each package says what it holds, and no module sits on the flat floor beside them.
SHARED_CONCERNS = {
    "contract": "what travels on Kafka: the topics' models, their registry and decoders, signing, the chain",
    "gpu": "GPU domain knowledge: DCGM fields, the XID catalogue, NVLink, processes, GPU and host identity",
    "settings": "a service's typed settings, where they are read from, their names and reference",
    "plumbing": "how a service runs: start and stop, logging, errors, Kafka and database clients, migrations",
    "store": "every SQL statement, by table family",
    "fakes": "NVML doubles and sample records for tests, benches and the evaluation",
}


def test_every_module_under_shared_sits_in_its_concerns_package() -> None:
    shared = REPO / "shared"
    loose = sorted(p.name for p in shared.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules directly under shared/ (move each into its concern's package): {loose}"
    packages = sorted(p.name for p in shared.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert packages == sorted(SHARED_CONCERNS), f"shared/'s packages {packages} are not its concerns"
    for name in packages:
        assert (shared / name / "__init__.py").is_file(), f"shared/{name} is not a package"


@pytest.mark.parametrize("concern", ["contract", "gpu", "settings"])
def test_the_contract_gpu_knowledge_and_settings_touch_no_database(concern: str) -> None:
    """They are read by every service, the collector on a GPU node among them: no SQL comes with them."""
    for path in sorted((REPO / "shared" / concern).rglob("*.py")):
        reached = [m for m in imported_modules(path) if m.startswith(("shared.store", "psycopg"))]
        assert not reached, f"{path.relative_to(REPO)} imports {reached}"


def _functions(top: str) -> list[tuple[str, int]]:
    found = []
    for path in sorted((REPO / top).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{path.relative_to(REPO)}:{node.lineno} {node.name}"
                found.append((name, node.end_lineno - node.lineno + 1))  # type: ignore[operator]
    return found


@pytest.mark.parametrize("top", ["services", "shared"])
def test_no_function_is_longer_than_a_screen(top: str) -> None:
    """80 lines: a step that needs more is several steps, each with a name (judgement is a table of rules)."""
    long = [f"{name} ({lines} lines)" for name, lines in _functions(top) if lines > 80]
    assert not long, "split these into named steps:\n" + "\n".join(long)


# `# fmt: skip` only where a reviewed table reads better hand-aligned than the formatter lays it out.
FMT_SKIP_MOST = 20


def test_one_formatting_style() -> None:
    kept = []
    for top in ("services", "shared", "gpuhealth"):
        for path in sorted((REPO / top).rglob("*.py")):
            lines = path.read_text().splitlines()
            kept += [
                f"{path.relative_to(REPO)}:{i}" for i, line in enumerate(lines, 1) if "# fmt: skip" in line
            ]
    assert len(kept) <= FMT_SKIP_MOST, f"{len(kept)} '# fmt: skip' (at most {FMT_SKIP_MOST}):\n" + "\n".join(
        kept
    )


def _distribution(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement)[0]).lower()  # type: ignore[index]


def _with_what_they_require(names: set[str]) -> set[str]:
    """The distributions and, transitively, what each installed one requires (extras not followed)."""
    found, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            required = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [_distribution(r) for r in required if "extra ==" not in r]
    return found


def test_what_the_pipeline_imports_is_installed_by_make_up() -> None:
    """`make up`'s venv has the runtime requirements only (the dev extra comes with `make test`): a service,
    a shared module or the stack's scripts importing a development package would fail on a fresh machine."""
    runtime = _with_what_they_require({_distribution(r) for r in requirements(dev=False)})
    owners = importlib.metadata.packages_distributions()
    own = {"services", "shared", "gpuhealth", "scripts"}
    missing = []
    for top in ("services", "shared", "scripts"):
        for path in sorted((REPO / top).rglob("*.py")):
            if "fakes" in path.parts:  # NVML doubles for tests and benches
                continue
            for module in imported_modules(path):
                name = module.split(".")[0]
                if name in own or name in sys.stdlib_module_names:
                    continue
                if not {_distribution(d) for d in owners.get(name, [name])} & runtime:
                    missing.append(f"{path.relative_to(REPO)}: {name}")
    assert not missing, "imports outside pyproject's runtime dependencies:\n" + "\n".join(missing)

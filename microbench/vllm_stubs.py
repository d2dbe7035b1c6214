"""Stand-ins for the packages vLLM imports that the device image lacks and the offline or
in-process serving engine never calls (OpenAI server, telemetry, structured output, Mistral
tokenizers): `install()` registers an import hook that returns empty modules for them."""
import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = {"anthropic", "mcp", "sentry_sdk", "mistral_common", "pycountry", "cryptography",
           "opentelemetry", "model_hosting_container_standards", "fastapi_cloud_cli",
           "tvm_ffi", "xgrammar", "llguidance", "supervisor", "rignore", "fastar"}


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: None})


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Stub(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


def install():
    if not any(isinstance(f, StubFinder) for f in sys.meta_path):
        sys.meta_path.append(StubFinder())
    # The stubbed opentelemetry imports cleanly, so vLLM 0.24 thinks tracing is available and its
    # @instrument wrappers (engine core and worker init) call the stub's tracer and fail
    # (session 21, in-process engine): switch tracing off before the decorated modules load.
    try:
        import vllm.tracing.otel as otel
        otel._IS_OTEL_AVAILABLE = False
    except ImportError:  # no vLLM on this machine
        pass

"""The public face of `forecasting` (its ``__init__``): every name resolves, lazily, to what the typed imports say."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import forecasting

FACE = Path(forecasting.__file__)


def _typed_imports() -> dict[str, str]:
    """Name -> home module of the ``if TYPE_CHECKING:`` imports of the face ("" for a sub-namespace)."""
    tree = ast.parse(FACE.read_text(encoding="utf-8"))
    [block] = [n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING"]
    out: dict[str, str] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module is not None
        home = "" if node.module == "forecasting" else node.module.removeprefix("forecasting.")
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: re-export it as itself"
            out[alias.name] = home
    return out


def test_the_lazy_table_and_the_typed_imports_agree() -> None:
    assert _typed_imports() == forecasting._HOMES
    assert sorted(forecasting.__all__) == sorted(forecasting._HOMES)


def test_every_public_name_resolves_to_its_home() -> None:
    for name, home in forecasting._HOMES.items():
        value = getattr(forecasting, name)
        if home:
            assert value is getattr(sys.modules[f"forecasting.{home}"], name)
        else:
            assert value is sys.modules[f"forecasting.{name}"]


def test_jsonio_alone_does_not_import_pandas_or_lightgbm() -> None:
    """A trainer worker imports `forecasting.jsonio` only; the face must not drag the models in."""
    code = (
        "import sys; from forecasting import jsonio; print(sorted({'pandas', 'lightgbm', 'pyarrow'} & {*sys.modules}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        forecasting.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("forecasting.no_such_name resolved")


def test_every_forecaster_has_its_history_window() -> None:
    for name in forecasting.FORECASTERS:
        model = forecasting.make_forecaster(name, 6)
        assert isinstance(model, forecasting.Forecaster)
        assert model.name == name

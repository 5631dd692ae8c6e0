"""Which bundle a user means: ``None`` (the default model), ``"demo"`` (the embedded pair) or a folder.

:class:`~xpuspec.models.bundle.ModelBundle` reads and verifies one bundle folder and knows nothing of
where folders come from; this module is the one place that turns what a user gave (``Pipeline(bundle)``,
a command's ``--bundle``) into that folder, building the default model's bundle on first use
(:mod:`xpuspec.models.default_model`). Pipeline, every command and the server open bundles through here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from xpuspec.models.bundle import ModelBundle

DEMO_BUNDLE_NAME = "demo"  # names the embedded demo pair wherever a bundle folder is asked for
DEMO_MODEL_NAME = "xpuspec-demo"  # the name the demo pair is served under
# A cache folder's name is the model's name and a key of what it was built from (default_model).
_CACHE_KEY_SUFFIX = re.compile(r"-[0-9a-f]{12}$")

BundleSpec = str | Path | None


def is_demo(spec: BundleSpec) -> bool:
    """``"demo"`` names the demo pair, unless a folder of that name is there (a folder wins)."""
    return spec is not None and str(spec) == DEMO_BUNDLE_NAME and not Path(spec).is_dir()


def resolve_bundle_path(spec: BundleSpec) -> Path:
    """The folder ``spec`` names; the default model's bundle is converted into the user's cache the
    first time ``None`` asks for it."""
    if spec is None:
        from xpuspec.models.default_model import default_bundle_path  # converting needs prepare: only on use

        return default_bundle_path()
    if is_demo(spec):
        from xpuspec.models.demo import demo_bundle_path

        return demo_bundle_path()
    return Path(spec).expanduser()


def resolve_bundle(spec: BundleSpec, *, verify: bool | None = None) -> ModelBundle:
    """Open the bundle ``spec`` names (``None``: the default model, ``"demo"``: the demo pair, else a
    folder); ``verify`` as :meth:`ModelBundle.open`. A missing or damaged bundle raises ``BundleError``."""
    bundle = ModelBundle.open(resolve_bundle_path(spec), verify=verify)
    if spec is None:
        from xpuspec.models.default_model import SMOLLM2

        return SMOLLM2.recommend_sampling(bundle)  # a bundle built before the recommendation: in memory
    return bundle


def model_names(spec: BundleSpec) -> tuple[str, ...]:
    """The names a server answers for the bundle ``spec`` names: its plain name first (what responses
    show), then older names that still work (aliases). ``xpuspec serve`` and an edge archive of the
    same bundle answer the same names. Computed from the name alone; no folder is opened.

    The default model: ``SmolLM2-135M-Instruct``, and its cache folder's name (``...-<key>``, what
    edge archives served before). The demo pair: ``xpuspec-demo``, and ``demo``. A folder: its name
    without a cache key suffix, and the full folder name when that differs.
    """
    if spec is None:
        from xpuspec.models.default_model import SMOLLM2

        return (SMOLLM2.name, f"{SMOLLM2.name}-{SMOLLM2.cache_key()}")
    if is_demo(spec):
        return (DEMO_MODEL_NAME, DEMO_BUNDLE_NAME)
    folder = os.path.basename(os.path.normpath(os.path.expanduser(str(spec)))) or DEMO_MODEL_NAME
    return tuple(dict.fromkeys((_CACHE_KEY_SUFFIX.sub("", folder) or folder, folder)))

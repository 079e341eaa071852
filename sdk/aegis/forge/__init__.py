"""Forge: build new models out of trained ones. Part 1: merges, from mergekit's YAML.

    from aegis.forge import merge_models, load_merge_config
    result = merge_models("merge.yml", "merged/")      # linear, slerp, task_arithmetic, ties,
    print(result.num_layers, result.shards)            # dare_ties, dare_linear, passthrough, dfs
    evomerge("evomerge.yml", "out/")                   # Part 2: evolve merges (aegis.forge.evomerge)

``aegis merge CONFIG.yml OUT`` is the same call with a progress bar (:mod:`aegis.cli.forge`).
Importing this package reads no weights and imports neither numpy nor safetensors.
"""

from aegis.forge.merge_config import MergeConfig, load_merge_config
from aegis.forge.dfs import DFSParameters, dfs_path
from aegis.forge.evomerge import EvoMergeConfig, EvoMergeResult, evomerge, load_evomerge_config
from aegis.forge.merge import MAX_SHARD_BYTES, MergeResult, merge_models

__all__ = ["MergeConfig", "MergeResult", "MAX_SHARD_BYTES", "load_merge_config", "merge_models", "merge_methods",
           "DFSParameters", "dfs_path", "EvoMergeConfig", "EvoMergeResult", "evomerge", "load_evomerge_config"]


def merge_methods() -> dict[str, str]:
    """The merge methods ``aegis merge`` implements, name -> one-line description."""
    from aegis.forge._methods import METHODS

    return {name: m.description for name, m in METHODS.items()}

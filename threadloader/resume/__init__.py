"""Mid-epoch resume: checkpoint a loader's position, and replay it in a new one.

- :mod:`.format`: the state dict (what it holds, checking and planning a loaded one).
- :mod:`.epoch`: epoch replay (the random state an epoch starts from, the resume plan).
- :mod:`.progress`: which batches were received, kept when an iterator is dropped.
- :mod:`.states`: the samplers' and datasets' own ``state_dict()``.
- :mod:`.rngstate`: generator states as base64 strings.
"""

from .epoch import (
                     DrawsAhead,
                     EpochStart,
                     ResumePlan,
                     draws_from_global_rng,
                     generators_of,
                     isolated_rng,
)
from .format import (
                     STATE_VERSION,
                     check_state,
                     loader_shape,
                     make_state,
                     plan_from_state,
                     unavailable_state,
)
from .progress import ProgressBox, RecordsProgressOnDrop, progress_record
from .rngstate import decode_rng_state, encode_rng_state
from .states import (
                     CheckpointUnavailable,
                     check_states,
                     dataset_has_state,
                     dataset_state_of,
                     same_state,
                     start_state_of,
)

__all__ = ["STATE_VERSION", "CheckpointUnavailable", "DrawsAhead", "EpochStart", "ProgressBox",
           "RecordsProgressOnDrop", "ResumePlan", "check_state", "check_states", "dataset_has_state",
           "dataset_state_of", "decode_rng_state", "draws_from_global_rng", "encode_rng_state", "generators_of",
           "isolated_rng", "loader_shape", "make_state", "plan_from_state", "progress_record", "same_state",
           "start_state_of", "unavailable_state"]

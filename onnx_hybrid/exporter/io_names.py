"""Graph input and output names as onnxruntime-genai 0.18 names them (docs/genai-config.md#graph-inputs-and-outputs)."""

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
LOGITS = "logits"
HIDDEN_STATES = "hidden_states"  # main decoder: post-norm hidden, what the MTP head drafts from; also its input
HIDDEN_STATES_OUT = "hidden_states_out"  # MTP head: post-mtp.norm hidden, fed back for chained drafts
STATE_UPDATE_CAPTURE_COUNT = "state_update_capture_count"
STATE_UPDATE_ACTIVE = "state_update_active"

# Templates with one %d (the decoder layer index), keyed like genai_config's decoder inputs/outputs.
PAST_KEY = "past_key_values.%d.key"
PAST_VALUE = "past_key_values.%d.value"
PAST_CONV = "past.%d.conv"
PAST_RECURRENT = "past.%d.recurrent"
PRESENT_KEY = "present.%d.key"
PRESENT_VALUE = "present.%d.value"
PRESENT_CONV = "present.%d.conv"
PRESENT_RECURRENT = "present.%d.recurrent"
# The step loop: each present output is fed back as this past input on the next step.
STATE_PAIRS = ((PRESENT_KEY, PAST_KEY), (PRESENT_VALUE, PAST_VALUE), (PRESENT_CONV, PAST_CONV),
               (PRESENT_RECURRENT, PAST_RECURRENT))
STATE_UPDATE_CONV_VALUE = "state_update.%d.conv_value"
STATE_UPDATE_RECURRENT_CAPSULE = "state_update.%d.recurrent_capsule"

# Symbolic dimension names.
BATCH = "batch_size"
SEQUENCE = "sequence_length"
PAST_SEQUENCE = "past_sequence_length"
TOTAL_SEQUENCE = "total_sequence_length"
# Shared KV buffers (--kv-cache shared): past and present are one buffer of search.max_length positions.
KV_BUFFER_LENGTH = "max_sequence_length"

# Paged export (docs/genai-config.md#paged-export): packed tokens, the block pool and its metadata.
CUMULATIVE_SEQUENCE_LENGTHS = "cumulative_sequence_lengths"
PAST_SEQUENCE_LENGTHS = "past_sequence_lengths"
BLOCK_TABLE = "block_table"
ATTENTION_METADATA = "attention_metadata"
TOKENS = "num_tokens"
BATCH_PLUS_ONE = "batch_size_plus_1"
NUM_BLOCKS = "num_blocks"
MAX_BLOCKS = "max_num_blocks"


def _layer_index(name: str, template: str) -> int | None:
    prefix, suffix = template.split("%d")
    middle = name[len(prefix):len(name) - len(suffix)]
    if name.startswith(prefix) and name.endswith(suffix) and middle.isdigit():
        return int(middle)
    return None


def _counterpart(name: str, side: int) -> str | None:
    """The other member of ``name``'s STATE_PAIRS entry (``side``: 0 present, 1 past); None for other names."""
    for pair in STATE_PAIRS:
        layer = _layer_index(name, pair[side])
        if layer is not None:
            return pair[1 - side] % layer
    return None


def past_of(present: str) -> str | None:
    """The input a ``present`` state output feeds on the next step (None for other names)."""
    return _counterpart(present, 0)


def present_of(past: str) -> str | None:
    """The output that carries a ``past`` state input to the next step (None for other names)."""
    return _counterpart(past, 1)

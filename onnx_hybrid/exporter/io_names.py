"""Graph input and output names: onnxruntime-genai 0.18's conventions (genai_config.md §2.3, §7)."""

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
STATE_UPDATE_CONV_VALUE = "state_update.%d.conv_value"
STATE_UPDATE_RECURRENT_CAPSULE = "state_update.%d.recurrent_capsule"

# Symbolic dimension names.
BATCH = "batch_size"
SEQUENCE = "sequence_length"
PAST_SEQUENCE = "past_sequence_length"
TOTAL_SEQUENCE = "total_sequence_length"

# Paged export (genai_config.md §2.5, §7.2): packed tokens, the block pool and its metadata.
CUMULATIVE_SEQUENCE_LENGTHS = "cumulative_sequence_lengths"
PAST_SEQUENCE_LENGTHS = "past_sequence_lengths"
BLOCK_TABLE = "block_table"
ATTENTION_METADATA = "attention_metadata"
TOKENS = "num_tokens"
BATCH_PLUS_ONE = "batch_size_plus_1"
NUM_BLOCKS = "num_blocks"
MAX_BLOCKS = "max_num_blocks"

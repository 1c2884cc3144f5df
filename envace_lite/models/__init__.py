"""Building a policy: loading a checkpoint or a profile's base model (``load``) and the
from-scratch ``micro`` policy with its BPE tokenizer (``micro``)."""

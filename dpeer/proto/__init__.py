"""Generated wire protocol (dpeer.v1); do not edit, run scripts/gen_proto.py."""

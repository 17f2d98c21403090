"""Records: decoding rules, bad records, dead letters and value schemas."""

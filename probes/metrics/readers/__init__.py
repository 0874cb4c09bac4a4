"""One reader per metric file format; each module also holds the sniffer that recognises it, so a
format's shape is described in one place."""

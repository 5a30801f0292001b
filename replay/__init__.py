"""Reading side: the assembler, position tokens, consumers and appliers."""

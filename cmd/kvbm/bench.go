package main

import "io"

func benchCommand(args []string, stdout, stderr io.Writer) error { return nil }

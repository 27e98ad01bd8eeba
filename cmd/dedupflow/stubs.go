package main

import (
	"context"
	"errors"
	"io"
)

func runLoadgen(context.Context, []string, io.Writer, io.Writer) error {
	return errors.New("loadgen: not built yet")
}

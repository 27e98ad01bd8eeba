package main

import (
	"context"
	"errors"
	"io"
)

func runPublish(context.Context, []string, io.Writer, io.Writer) error {
	return errors.New("publish: not built yet")
}
func runLoadgen(context.Context, []string, io.Writer, io.Writer) error {
	return errors.New("loadgen: not built yet")
}

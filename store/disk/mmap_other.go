//go:build !linux

package disk

const mmapFlags = 0

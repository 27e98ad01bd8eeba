// Package bboltstorage holds bbolt's side of the broker's storage
// comparison: BenchmarkStorage/bbolt runs the workload of the broker's own
// BenchmarkStorage/log (broker/storage_bench_test.go) through bbolt, so that
// bbolt stays out of the go.mod of the module users import. Run both in one
// go test from the repository's root (go.work):
//
//	go test -run '^$' -bench Storage -benchtime 1x ./broker ./bench/bboltstorage
package bboltstorage

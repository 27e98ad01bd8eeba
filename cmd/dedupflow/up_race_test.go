//go:build race

package main

// raceEnabled: the test binary is built with -race, so the tests that run
// the built binary build dedupflow with -race too and reuse the packages
// this build compiled.
const raceEnabled = true

//go:build race

package main

// raceEnabled: the test binary is built with -race, so TestUpBinary builds
// dedupflow with -race too and reuses the packages this build compiled.
const raceEnabled = true

//go:build race

package e2e

// raceEnabled: the test binary is built with -race, so the commands the
// tests run are built with -race too, reusing the packages already compiled.
const raceEnabled = true

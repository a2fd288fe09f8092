//go:build race

package ring

// raceBuild: this is a -race build (engine_race.go).
const raceBuild = true

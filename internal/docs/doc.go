// Package docs holds the tests that keep the repository's documentation
// within its rules: README.md stays a short front door (at most 16 KB),
// every relative Markdown link resolves (files and heading anchors), and
// no file narrates the project's development history.
package docs

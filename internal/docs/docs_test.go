package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// maxReadmeBytes is the README's budget: depth belongs in docs/.
const maxReadmeBytes = 16 * 1024

// repoRoot is the module root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("%s is not the module root: %v", root, err)
	}
	return root
}

// skipDir names directories that hold no project text: build output,
// generated copies and VCS data.
func skipDir(name string) bool {
	switch name {
	case ".git", ".wasmbuild", "dist", "node_modules":
		return true
	}
	return false
}

// repoFiles returns every file under root whose name satisfies keep.
func repoFiles(t *testing.T, root string, keep func(path string) bool) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if keep(path) {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestReadmeIsAShortFrontDoor(t *testing.T) {
	root := repoRoot(t)
	fi, err := os.Stat(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > maxReadmeBytes {
		t.Errorf("README.md is %d bytes, over its %d-byte budget: move depth into docs/<topic>.md and link it", fi.Size(), maxReadmeBytes)
	}
}

// link is one Markdown link found in a file.
type link struct {
	file   string
	line   int
	target string
}

var (
	// inlineLink matches [text](target) and ![alt](target); the target
	// ends at the first space (a title may follow) or closing parenthesis.
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	codeSpan   = regexp.MustCompile("`[^`]*`")
	heading    = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
)

// markdownLinks returns the links of a Markdown file, outside code blocks
// and code spans, and the GitHub anchors of its headings.
func markdownLinks(t *testing.T, path string) (links []link, anchors map[string]bool) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	anchors = map[string]bool{}
	seen := map[string]int{}
	inFence := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if trimmed := strings.TrimSpace(line); strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		if m := heading.FindStringSubmatch(line); m != nil {
			slug := githubSlug(m[2])
			if k := seen[slug]; k > 0 {
				anchors[fmt.Sprintf("%s-%d", slug, k)] = true
			} else {
				anchors[slug] = true
			}
			seen[slug]++
		}
		for _, m := range inlineLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
			links = append(links, link{file: path, line: n, target: m[1]})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return links, anchors
}

// githubSlug is the anchor GitHub gives a heading: lower case, spaces to
// hyphens, punctuation other than hyphens and underscores dropped.
func githubSlug(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestMarkdownLinksResolve(t *testing.T) {
	root := repoRoot(t)
	files := repoFiles(t, root, func(p string) bool { return strings.HasSuffix(p, ".md") })
	if len(files) == 0 {
		t.Fatal("no Markdown files found")
	}
	anchorsOf := map[string]map[string]bool{}
	var all []link
	for _, f := range files {
		links, anchors := markdownLinks(t, f)
		anchorsOf[f] = anchors
		all = append(all, links...)
	}
	checked := 0
	for _, l := range all {
		target := l.target
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue // external: not checked offline
		}
		checked++
		where := fmt.Sprintf("%s:%d", rel(root, l.file), l.line)
		path, frag, _ := strings.Cut(target, "#")
		dest := l.file
		if path != "" {
			if strings.HasPrefix(path, "/") {
				t.Errorf("%s: link %q is absolute; use a path relative to the file", where, target)
				continue
			}
			dest = filepath.Join(filepath.Dir(l.file), filepath.FromSlash(path))
			fi, err := os.Stat(dest)
			if err != nil {
				t.Errorf("%s: link %q: %s does not exist", where, target, rel(root, dest))
				continue
			}
			if fi.IsDir() {
				if frag != "" {
					t.Errorf("%s: link %q: an anchor on a directory", where, target)
				}
				continue
			}
		}
		if frag == "" {
			continue
		}
		anchors, ok := anchorsOf[dest]
		if !ok {
			if !strings.HasSuffix(dest, ".md") {
				continue // anchors into source files (line numbers) are not checked
			}
			_, anchors = markdownLinks(t, dest)
			anchorsOf[dest] = anchors
		}
		if !anchors[frag] {
			t.Errorf("%s: link %q: %s has no heading with anchor #%s", where, target, rel(root, dest), frag)
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the link parser is broken")
	}
}

// historyPatterns find a file narrating the project's development (a
// numbered work session, or "this" or "before" one): history lives in git,
// not in the code or the docs. The words are split so that this file does
// not match itself.
var historyPatterns = []*regexp.Regexp{
	regexp.MustCompile(`(?i)\b` + "sess" + `ions?[ -]?[0-9]+\b`),
	regexp.MustCompile(`(?i)\b(this|previous|earlier|before|since|until|during) ` + "sess" + `ion\b(?:'s)?(?:\s+(\w+))?`),
}

// sessionNouns are the words after "session" that make it the routing
// concept (a client's session), not a development session.
var sessionNouns = map[string]bool{"id": true, "ids": true, "key": true, "keys": true, "header": true, "affinity": true, "table": true, "pin": true}

func TestNoFileNarratesDevelopmentHistory(t *testing.T) {
	root := repoRoot(t)
	textFile := func(p string) bool {
		switch filepath.Ext(p) {
		case ".go", ".md", ".yaml", ".yml", ".json", ".mjs", ".js", ".sh", ".txt":
			return true
		}
		return filepath.Base(p) == "Makefile"
	}
	files := repoFiles(t, root, textFile)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(data), "\n") {
			for _, re := range historyPatterns {
				for _, m := range re.FindAllStringSubmatch(line, -1) {
					if len(m) > 2 && sessionNouns[strings.ToLower(m[2])] {
						continue
					}
					t.Errorf("%s:%d: %q narrates development history; say what is true now (history lives in git)", rel(root, f), n+1, m[0])
				}
			}
		}
	}
}

// costModelRestated finds a comment restating the Wasm cost model (that a
// request in Wasm is charged for every function it enters), which
// docs/performance.md states once; comments point there instead.
var costModelRestated = regexp.MustCompile(`(?i)in wasm,? (?:where )?(?:each|every|a) (?:request|response) ` + "pays" + ` for`)

// commentWrap joins wrapped // comments so that a phrase split over two
// lines is found.
var commentWrap = regexp.MustCompile(`\n\s*//\s*`)

func TestCommentsPointAtTheCostModel(t *testing.T) {
	root := repoRoot(t)
	files := repoFiles(t, root, func(p string) bool { return filepath.Ext(p) == ".go" })
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		joined := commentWrap.ReplaceAllString(string(data), " ")
		if loc := costModelRestated.FindStringIndex(joined); loc != nil {
			t.Errorf("%s restates the Wasm cost model (%q): write \"each function entered costs a request (docs/performance.md)\" and keep the comment's own reason", rel(root, f), joined[loc[0]:loc[1]])
		}
	}
}

// TestNoConflictMarkers: a merge that left its markers in a document
// (Go files fail to compile with them; Markdown and YAML do not).
func TestNoConflictMarkers(t *testing.T) {
	root := repoRoot(t)
	files := repoFiles(t, root, func(p string) bool {
		switch filepath.Ext(p) {
		case ".md", ".yaml", ".yml", ".json", ".mjs", ".txt":
			return true
		}
		return filepath.Base(p) == "Makefile"
	})
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "<<<<<<< ") || strings.HasPrefix(line, ">>>>>>> ") {
				t.Errorf("%s:%d: a merge conflict marker: resolve the conflict, keeping both sides' intent", rel(root, f), n+1)
			}
		}
	}
}

// TestNoFileCitesAMissingDesignDoc: the design lives in docs/; a comment
// that cites a document must cite one the repository has.
func TestNoFileCitesAMissingDesignDoc(t *testing.T) {
	root := repoRoot(t)
	name := "DESIGN" + ".md"
	if _, err := os.Stat(filepath.Join(root, name)); err == nil {
		t.Skipf("%s exists", name)
	}
	files := repoFiles(t, root, func(p string) bool {
		ext := filepath.Ext(p)
		return ext == ".go" || ext == ".md"
	})
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, name) {
				t.Errorf("%s:%d cites %s, which the repository does not have: cite the docs/ file that holds that contract", rel(root, f), n+1, name)
			}
		}
	}
}

func rel(root, p string) string {
	if r, err := filepath.Rel(root, p); err == nil {
		return filepath.ToSlash(r)
	}
	return p
}

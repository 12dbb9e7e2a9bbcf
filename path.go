package ratelimit

import (
	"fmt"
	"net/url"
	"path"
	"strings"
)

// pathFilter decides which requests a layer counts. Patterns are exact ("/login") or prefixes
// ("/assets/*", which matches "/assets" and everything below it).
type pathFilter struct {
	only   patternSet // when not empty, only matching paths are counted
	exempt patternSet // matching paths are never counted
}

type patternSet struct {
	all      bool // the pattern "/*"
	exact    map[string]struct{}
	prefixes []string // "/assets/" for "/assets/*"
}

func (s *patternSet) empty() bool { return !s.all && len(s.exact) == 0 && len(s.prefixes) == 0 }

func (s *patternSet) match(p string) bool {
	if s.all {
		return true
	}
	if _, ok := s.exact[p]; ok {
		return true
	}
	for _, prefix := range s.prefixes {
		if strings.HasPrefix(p, prefix) {
			return true
		}
	}
	return false
}

func compilePatterns(patterns []string) (patternSet, error) {
	var s patternSet
	for _, p := range patterns {
		if err := checkPattern(p); err != nil {
			return patternSet{}, err
		}
		base, isPrefix := strings.CutSuffix(p, "/*")
		switch {
		case isPrefix && base == "":
			s.all = true
		case isPrefix:
			// "/assets" itself is exact; everything below it shares the prefix "/assets/".
			s.prefixes = append(s.prefixes, base+"/")
			fallthrough
		default:
			if s.exact == nil {
				s.exact = make(map[string]struct{})
			}
			s.exact[base] = struct{}{}
		}
	}
	return s, nil
}

func checkPattern(p string) error {
	base, _ := strings.CutSuffix(p, "/*")
	switch {
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("path pattern %q must start with \"/\"", p)
	case strings.ContainsAny(base, "*?#"):
		return fmt.Errorf("path pattern %q: \"*\" may only end a pattern, as \"/*\", and \"?\" and \"#\" are not part of a path", p)
	case strings.ContainsFunc(p, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return fmt.Errorf("path pattern %q contains a space or control character", p)
	case base != "" && path.Clean(base) != base:
		return fmt.Errorf("path pattern %q is not a clean path (want %q)", p, path.Clean(base))
	}
	return nil
}

// match reports whether the layer counts a request for u. Routers disagree on which path they
// route: r.URL.Path is decoded, while Go's ServeMux and chi route on the escaped path, where
// "%2F" is not a "/" and "%2E%2E" is not "..". So when the two differ, both are judged and the
// doubt goes to counting: a path is counted if either view is, and exempt only if both are. For
// the same reason a request without a URL (net/http never serves one, but a hand-built request
// may lack it) is counted.
func (f *pathFilter) match(u *url.URL) bool {
	if u == nil {
		return true
	}
	decoded := cleanPath(u.Path)
	if u.RawPath == "" {
		// Without RawPath the escaped path is u.Path with only characters escaped that cleaning
		// never looks at ("/" and "." are never escaped), so both views agree.
		return f.matchClean(decoded, decoded)
	}
	return f.matchClean(decoded, cleanPath(u.EscapedPath()))
}

func (f *pathFilter) matchClean(decoded, escaped string) bool {
	if !f.only.empty() && !f.only.match(decoded) && !f.only.match(escaped) {
		return false
	}
	return !f.exempt.match(decoded) || !f.exempt.match(escaped)
}

// cleanPath returns the path a router would route p to, so that "/login/", "//login",
// "/./login" or "/x/../login" cannot slip past a filter on "/login". An already clean path is
// returned as it is, without allocating.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	return path.Clean(p)
}

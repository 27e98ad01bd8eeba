// Package webstatic holds what the console and the broker page share: their
// stylesheet, and a file server that answers 404 for a folder instead of
// listing it.
package webstatic

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed style.css
var shared embed.FS

// Stylesheet is the name under which Files serves the shared stylesheet.
const Stylesheet = "style.css"

// Files serves the files of own and the shared stylesheet, below the
// prefix it is mounted at (strip it first). A folder, or a name that is
// none of these files, is 404: a listing would only show what the page
// does not link.
func Files(own fs.FS) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/")
		fsys := own
		if name == Stylesheet {
			fsys = shared
		}
		if name == "" || strings.HasSuffix(name, "/") {
			http.NotFound(w, r)
			return
		}
		if st, err := fs.Stat(fsys, name); err != nil || st.IsDir() {
			http.NotFound(w, r)
			return
		}
		http.ServeFileFS(w, r, fsys, name)
	})
}

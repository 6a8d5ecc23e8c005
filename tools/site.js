// The course's website (tools/site.py copies this to assets/course.js). Opened from files (file://), a browser
// runs no search worker, so Material's search is absent: say so, and how to serve the site, where the search box
// would be.
document.addEventListener("DOMContentLoaded", function () {
  if (location.protocol !== "file:") return;
  var note = document.createElement("div");
  note.className = "file-search-note";
  note.textContent =
    "Search needs the site served over HTTP: opened from files, the browser runs no search. Serve this " +
    "page's folder with  python -m http.server --directory FOLDER  and open http://127.0.0.1:8000/";
  var main = document.querySelector(".md-main") || document.body;
  main.parentNode.insertBefore(note, main);
});

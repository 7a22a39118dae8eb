// A click on a figure shows it at its full size over the page (drawn at the column's
// width, a 1290-pixel figure's legends are hard to read); a click or Escape closes it.
// The figures are the page's own images, so nothing is fetched.
document.addEventListener("click", function (event) {
  var open = document.querySelector(".dk-figure-full");
  if (open) {
    open.remove();
    return;
  }
  var img = event.target.closest ? event.target.closest(".md-content img") : null;
  if (!img || img.closest("a")) return;  // a linked image keeps its link
  var layer = document.createElement("div");
  layer.className = "dk-figure-full";
  var full = document.createElement("img");
  full.src = img.src;
  full.alt = img.alt;
  layer.appendChild(full);
  document.body.appendChild(layer);
});
document.addEventListener("keydown", function (event) {
  var open = document.querySelector(".dk-figure-full");
  if (open && event.key === "Escape") open.remove();
});

// Copy buttons: <button data-copy="#id"> copies the text of the element it names.
document.addEventListener("click", function (event) {
  var button = event.target.closest("button[data-copy]");
  if (!button) return;
  var source = document.querySelector(button.getAttribute("data-copy"));
  if (!source) return;
  var text = source.value !== undefined ? source.value : source.textContent;
  var done = function () {
    button.setAttribute("data-copied", "true");
    var said = button.querySelector(".said");
    if (said) said.textContent = "Copied";
  };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text.trim()).then(done, done);
  } else {
    var area = document.createElement("textarea");
    area.value = text.trim();
    document.body.appendChild(area);
    area.select();
    try { document.execCommand("copy"); } catch (e) {}
    document.body.removeChild(area);
    done();
  }
});

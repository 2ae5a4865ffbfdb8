var e=[{expand:"strDouble"}];export{e as default};
